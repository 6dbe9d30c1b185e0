"""The replayer: the calls a bug's failing tests made into the repository (``recorder``), made again
in a process that holds no verdict, on a copy of a fresh checkout made for it.

It runs inside the sandbox as ``python REPLAYER ORDERS`` in the tests' environment, from a
folder and file named per run, as the second runner does: it reads its orders (the pickled calls,
the nonce and descriptor to answer on, the guard's module, the lines the change wrote, the time a
call may take, and a seed where it should also make calls of its own), deletes them, puts an empty
module in place of ``__main__``, installs the guard and makes what the code under test reads of its
process a plain run's (``guard.as_a_user``: the string hash seed the harness starts it with,
``PYTHONHASHSEED``, out of ``os.environ``) before any code of the repository is loaded.
Then, for each call in order, in a fresh folder of its own as its working directory (holding the
files the test's temporary folder held), it loads the call's arguments and calls what a user
reaches by the function's name: the module's or the class's attribute of that name (a method with
``self`` first, a classmethod with the call's own ``cls``, a property read or set), with the
arguments laid out as the original function took them (``recorder``). It describes what came of it
as data, as a test compares it (``describe``): the value returned (values that ``==`` makes equal
alike whatever their class: a float and the int it equals, a str subclass and its text, a Counter,
or a mapping that is no dict, and the dict it equals;
every item of a sequence, the first ``ITEMS`` in full and the rest in a digest; an object's
attributes, ``__slots__`` included; never an address, in a repr or in a text) or the exception
raised (its class's path and its message), the arguments as the call left them (a method's effect
on ``self``), the warnings it gave, what it printed to stdout and to stderr (read at descriptors 1
and 2, which point at files of its own while the call runs: ``sys.stdout`` stays the process's own
stream, as in a user's process), and what it left in its folder (names, sizes, digests). It
writes, on the descriptor, one line: ``NONCE`` and a JSON list with, per call, a digest of that
description with its first ``NUMBERS`` numbers taken out, its first characters, and those numbers'
exact text, which the harness compares within a tolerance (``replay.alike``; numbers past them are
in the digest, floats to twelve significant digits). With a seed, after each recorded call it makes
``variants`` calls of its own that leave the recorded shape (one argument moved near or far, of
another type, or inside a container or an object, in a copy; arguments passed by name) and,
once a function, the recorded call after as many of the same as fit its time (``made_again``), and
answers them too, in the order it made them, and writes their pickles (with the recorded call each
follows), so that the harness can make the same calls again elsewhere.
Everything it uses after the repository's code loads (unpickling, importing, encoding, hashing) is
bound before, and the answer line is encoded by its own few lines, so that code which replaces a
function of the standard library changes nothing here.

A call that runs past its time (kept from outside the process, ``guard.time_limit``) is answered
``"timeout"``; after one, the replayer makes no calls
of its own, and where its orders say ``stop_when_late`` (a change's replay) it answers every later
call ``"not reached"`` without making it, so that a loop in the code costs one call's time.

Nothing here decides a verdict: the harness compares these descriptions with those of the original
code, made in another process, which this one cannot reach. Whatever the code under test does here,
it can only change its own answers.
"""

# a private copy of the builtins, taken before any code of the repository runs: every function this
# module defines looks names up there, so code under test that replaces a builtin changes nothing here
__builtins__ = dict(vars(__import__("builtins")))

import binascii
import collections
import collections.abc
import copy
import hashlib
import importlib
import json
import os
import pickle
import random
import re
import shutil
import stat
import sys
import time
import types
import warnings
from itertools import islice
from pathlib import Path, PurePath

ITEMS, DEPTH, SHOWN = 200, 6, 160  # items of a container or iterator described, nesting, characters shown
MADE_BYTES = 64 << 10  # the pickles of the calls it makes, in all
TIMEOUT, NOT_REACHED, REFUSED = '"timeout"', '"not reached"', '"refused"'
NOT_REPLAYED = "not replayed"  # the call could not be loaded or found, or it left the process
# bound before any code of the repository runs (module attributes can be replaced; these names cannot be reached)
WRITE, SHA, LOADS, DUMPS = os.write, hashlib.sha256, pickle.loads, pickle.dumps
FROM_BASE64, TO_BASE64, IMPORT = binascii.a2b_base64, binascii.b2a_base64, importlib.import_module
CATCH_WARNINGS, WARN_ALWAYS = warnings.catch_warnings, warnings.simplefilter
NAMED = (types.FunctionType, types.BuiltinFunctionType, type, types.ModuleType)
WITHOUT_ADDRESSES = re.compile(r"0x[0-9a-fA-F]+").sub
#: an object's default repr kept in a text ("<Foo object at 0x7f...>"): the address goes, the rest stays
ADDRESS_IN_TEXT = re.compile(r" at 0x[0-9a-fA-F]+").sub
#: how answers are described: a replay recorded under another number is not compared (``Replay.judged``)
DESCRIBED = 4
PRINTED = 10_000  # characters of what a call printed to each stream that its description keeps
MESSAGE = 1000  # characters of an exception's message that its description keeps
NUMBERS = 64  # numbers a call's answer carries beside its digest, compared within a tolerance (``replay.alike``)
FILES, FILE_BYTES = 100, 16 << 20  # entries of a call's folder described; bytes of a file digested
ORDERED = collections.OrderedDict
LIST_FOLDER, LSTAT, OPEN, READ, FSTAT, CLOSE = os.listdir, os.lstat, os.open, os.read, os.fstat, os.close
DUP, DUP2, PREAD, UNLINK = os.dup, os.dup2, os.pread, os.unlink
MAKE_FOLDER, MAKE_FOLDERS, CHANGE_FOLDER, CURRENT_FOLDER = os.mkdir, os.makedirs, os.chdir, os.getcwd
RANDOM_BYTES = os.urandom
REMOVE_TREE, IS_FOLDER, IS_FILE, IS_LINK = shutil.rmtree, stat.S_ISDIR, stat.S_ISREG, stat.S_ISLNK
MEMORY = memoryview
#: the built-in containers whose subclasses are described by what the built-in type holds
BUILT_IN_CONTAINERS = (list, tuple, collections.deque, collections.OrderedDict, dict, set, frozenset)
READ_ONLY = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK  # a link or a FIFO the call left is not followed or waited on
WRITE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
PRINTED_TO = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # what a call prints: ``printing``
#: where each call's own folder is made: the replayer's run folder
RUN_FOLDER = os.path.dirname(os.path.realpath(__file__))
TYPE_MODULE, TYPE_QUALNAME = type.__dict__["__module__"].__get__, type.__dict__["__qualname__"].__get__
MAPPING, SET, PURE_PATH = collections.abc.Mapping, collections.abc.Set, PurePath
ESCAPED = {'"': '\\"', "\\": "\\\\"}


def main() -> None:
    orders_path = Path(sys.argv[1])
    orders = json.loads(orders_path.read_text())
    orders_path.unlink()
    nonce, fd, calls, seed = orders["nonce"], orders["fd"], orders["calls"], orders.get("seed")
    root = orders.get("root") or os.getcwd()  # a change's replay runs in a copy of the checkout made per run
    sys.modules["__main__"] = types.ModuleType("__main__")
    # the folders the tests ran with on the path (the test modules whose classes arguments are), then the root
    sys.path[:0] = [os.path.join(root, path) for path in orders.get("paths") or []] + [root]
    guard = IMPORT(orders["guard"])
    out_of_time, within = guard.OutOfTime, guard.time_limit(fd, nonce)
    refusals, _ = guard.install(root, orders.get("written") or {})
    # the string hash seed the harness gave every replay of these calls, unless the tests' environment set its own
    given = orders.get("hash_seed") is not None and os.environ.get("PYTHONHASHSEED") == str(orders["hash_seed"])
    hashing = ("PYTHONHASHSEED",) if given else ()
    guard.as_a_user(os.path.dirname(os.path.realpath(__file__)), None, hashing, ["-"])  # a user's: ``python -``
    del guard
    answers, made, size, late = [], [], 0, False
    rng, repeated, repeating = random.Random(seed), set(), REPEAT_SECONDS
    for index, call in enumerate(calls):
        if late and orders.get("stop_when_late"):  # one call past its time: the rest is not reached
            answers.append([SHA(NOT_REACHED.encode()).hexdigest(), NOT_REACHED, []])
            continue
        answers.append(replay(call, orders["time_limit"], within, refusals, out_of_time))
        late = late or answers[-1][1] == TIMEOUT
        if seed is None or late:  # no calls of its own once one has run out of time: what it costs is bounded
            continue
        try:
            with within(orders["time_limit"]):
                recorded = LOADS(FROM_BASE64(call))
                moved_calls = variants(recorded, rng, orders.get("variants", 2))
        except Exception:  # the recorded call does not load, or moving it ran past its time
            recorded, moved_calls = None, []
        for variant, shown in [*moved_calls, (None, None)]:
            if variant is None:  # then, once a function, the recorded call after as many of the same as fit
                if recorded is None or recorded[:2] in repeated or repeating <= 0:
                    break
                repeated.add(recorded[:2])
                try:
                    with within(orders["time_limit"]):
                        variant, _ = made_again(recorded, MANY, CLOCK() + min(repeating, REPEAT_SECONDS_A_CALL))
                except Exception:
                    break
            size += len(variant)
            if size > MADE_BYTES:
                break
            started = CLOCK()
            REPEATS.clear()
            answers.append(replay(variant, orders["time_limit"], within, refusals, out_of_time))
            if shown is None:  # the call kept says how many were made: every later replay makes as many
                repeating -= CLOCK() - started
                try:
                    with within(orders["time_limit"]):
                        variant, shown = made_again(recorded, REPEATS[-1] if REPEATS else 0)
                except Exception:  # it cannot be pickled again: it is not kept
                    answers.pop()
                    break
            made.append([variant, shown, str(index)])
            if answers[-1][1] == TIMEOUT:
                late = True
                break
    data = (nonce + " " + encoded([answers, made]) + "\n").encode()
    while data:
        data = data[WRITE(fd, data) :]


def replay(call: str, seconds: float, within, refusals, out_of_time) -> list:
    """[digest, first characters, numbers] of what came of one call (``describe``), made with a fresh
    folder of its own as its working directory, holding what its test's temporary folder held
    (``put_back``): what it returned or raised (``exception``), its arguments as it left them, the
    warnings it gave, what it printed to stdout and to stderr, and what it left in its folder
    (``folder_described``). The digest is of the description with its first
    ``NUMBERS`` numbers taken out (``encoded``), which go beside it, to be compared within a tolerance
    (``replay.alike``); the first characters show them."""
    before, numbers = len(refusals()), []
    folder, back = RUN_FOLDER + "/c" + RANDOM_BYTES(8).hex(), where_it_runs()
    try:
        with within(seconds):
            module, qualname, kind, layout, arguments = LOADS(FROM_BASE64(call))
            MAKE_FOLDER(folder, 0o700)
            put_back(folder, layout.get("folder") or {})
            CHANGE_FOLDER(folder)
            streams = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
            held = printing()
            try:
                with CATCH_WARNINGS(record=True) as warned:
                    WARN_ALWAYS("always")
                    try:
                        returned = ["returned", describe(call_as_a_user(module, qualname, kind, layout, arguments))]
                    except Exception as exc:  # past its time, the call is interrupted (no Exception): ``within``
                        returned = ["raised", *exception(exc)]
            finally:
                texts = [without_addresses(text) for text in printed(held, streams)]
            given = [exception(each.message) for each in warned]
            description = [returned, describe(arguments), given, *texts, folder_described(folder)]
            said, digested = encoded(description), encoded(description, numbers)
    except out_of_time:
        said, digested, numbers = TIMEOUT, TIMEOUT, []
    except BaseException as exc:  # it could not be loaded or found, or it left by SystemExit
        said = digested = encoded([NOT_REPLAYED, type(exc).__name__])
        numbers = []
    finally:
        leave(folder, back)
    if len(refusals()) > before:  # the change asked the guard for something while this call ran
        said, digested, numbers = REFUSED, REFUSED, []
    return [SHA(digested.encode()).hexdigest(), said[:SHOWN], numbers]


def printing() -> list[int]:
    """Descriptors 1 and 2 pointed at two fresh files of the run folder, unlinked as they are made
    (nothing the call lists finds them; the disk they take is freed as the call ends), for the next
    call to print to, once what the process's streams held has gone where it was going: [where 1 and
    2 pointed before, the two files]."""
    flushed()
    files = []
    try:
        for _ in range(2):
            name = RUN_FOLDER + "/p" + RANDOM_BYTES(8).hex()
            files.append(OPEN(name, PRINTED_TO, 0o600))
            UNLINK(name)
        held = [DUP(1), DUP(2), *files]
    except BaseException:
        for each in files:
            CLOSE(each)
        raise
    DUP2(held[2], 1)
    DUP2(held[3], 2)
    return held


def printed(held: list[int], streams: tuple) -> list[str]:
    """What the call printed at descriptors 1 and 2 (``printing``), the first ``PRINTED`` characters
    of each (UTF-8, an undecodable byte replaced), once the streams it left and the process's own are
    flushed; descriptors 1 and 2 put back where they pointed, and the process's streams (``sys.stdout``,
    ``sys.stderr``, ``sys.__stdout__``, ``sys.__stderr__``) back in place where the call replaced them.
    A call that closed a descriptor or pointed another there only changes what it printed."""
    try:
        flushed()
    finally:
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__ = streams
        for each, before in ((1, held[0]), (2, held[1])):
            try:
                DUP2(before, each)
            except OSError:  # the call closed the descriptor kept: 1 or 2 stays where the call left it
                continue
        texts = [printed_in(file) for file in held[2:]]
        for each in held:
            try:
                CLOSE(each)
            except OSError:  # the call closed it
                continue
    return texts


def printed_in(file: int) -> str:
    """The first ``PRINTED`` characters of a file a call printed to, "" where the call closed it."""
    try:
        return PREAD(file, PRINTED * 4, 0).decode("utf-8", "replace")[:PRINTED]
    except OSError:
        return ""


def flushed() -> None:
    """The process's streams flushed: those a call left in ``sys`` and the process's own (a call may
    have closed or replaced them, or given them a ``flush`` that raises)."""
    for each in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            each.flush()
        except Exception:  # closed, replaced by what has no flush, or a flush of the call's that raises
            continue


def where_it_runs() -> str:
    """The working directory a call's folder is left for: the replayer's run folder where a call
    removed the one it ran in."""
    try:
        return CURRENT_FOLDER()
    except OSError:
        return RUN_FOLDER


def leave(folder: str, back: str) -> None:
    """Go back to ``back`` (wherever the call went) and remove the call's folder."""
    for each in (back, RUN_FOLDER):
        try:
            CHANGE_FOLDER(each)
            break
        except OSError:  # a call removed it
            continue
    REMOVE_TREE(folder, ignore_errors=True)


def put_back(folder: str, files: dict) -> None:
    """Write in the call's ``folder`` the files the test's temporary folder held as the call started
    (``recorder.held``: relative name -> bytes); a name that would leave the folder is not written."""
    for relative, data in files.items():
        parts = relative.split("/")
        if not relative or relative.startswith("/") or ".." in parts:
            continue
        if len(parts) > 1:
            MAKE_FOLDERS(folder + "/" + "/".join(parts[:-1]), 0o700, exist_ok=True)
        opened = OPEN(folder + "/" + relative, WRITE_NEW, 0o600)
        try:
            while data:
                data = data[WRITE(opened, data) :]
        finally:
            CLOSE(opened)


def folder_described(folder: str) -> list:
    """What a call left in its folder: how many entries it holds and the first ``FILES`` (in sorted
    order) each by its name relative to the folder and what it is: a folder, a link (not followed),
    a file with its size and a digest of its first ``FILE_BYTES`` bytes, or something else."""
    if not IS_FOLDER(LSTAT(folder).st_mode):  # the call put something else in its place
        return ["no folder"]
    found, waiting = [], [""]
    while waiting:
        inside = waiting.pop()
        try:
            names = LIST_FOLDER(folder + "/" + inside)
        except OSError:
            found.append([inside, "unreadable"])
            continue
        for name in names:
            relative = inside + name
            mode = LSTAT(folder + "/" + relative).st_mode
            found.append([relative, mode])
            if IS_FOLDER(mode) and relative.count("/") < DEPTH:
                waiting.append(relative + "/")
    found.sort(key=lambda entry: entry[0])
    return [str(len(found)), [entry_described(folder, *entry) for entry in found[:FILES]]]


def entry_described(folder: str, relative: str, mode) -> list[str]:
    if type(mode) is str or IS_FOLDER(mode):
        return [relative, mode if type(mode) is str else "folder"]
    if IS_LINK(mode):
        return [relative, "link"]
    try:
        opened = OPEN(folder + "/" + relative, READ_ONLY)
    except OSError:
        return [relative, "unreadable"]
    try:
        status = FSTAT(opened)
        if not IS_FILE(status.st_mode):
            return [relative, "other"]
        digest, left = SHA(), FILE_BYTES
        while left > 0 and (chunk := READ(opened, min(left, 1 << 20))):
            digest.update(chunk)
            left -= len(chunk)
        return [relative, "file", str(status.st_size), digest.hexdigest()]
    finally:
        CLOSE(opened)


def call_as_a_user(module: str, qualname: str, kind: str, layout: dict, arguments: dict):
    """Call what a user reaches by ``qualname`` in ``module``: the attribute of that name on the
    module or on its class (a method called with ``self`` first, as ``Class.method(self, ...)`` and
    ``super()`` call it; a classmethod's function with the call's own ``cls``; a property read or
    set on ``self``), with the arguments laid out as the original function took them (``layout``)."""
    *path, name = qualname.split(".")
    owner = IMPORT(module)
    for part in path:
        owner = getattr(owner, part)
    # in order until the first left out (its default was taken), by name after it
    given = [each in arguments for each in layout["positional"]]
    upto = given.index(False) if False in given else len(given)
    positional = [arguments[each] for each in layout["positional"][:upto]]
    keywords = {each: arguments[each] for each in layout["positional"][upto:] if each in arguments}
    if layout["varargs"] and upto == len(given):
        positional.extend(arguments.get(layout["varargs"], ()))
    keywords.update({each: arguments[each] for each in layout["keyword"] if each in arguments})
    if layout["varkw"]:
        keywords.update(arguments.get(layout["varkw"], {}))
    found = getattr(owner, name)
    # a call made after as many of the same first (``made_again``), each with its arguments loaded
    # afresh, or as many as fit before ``calls_until``: how many were made is kept in ``REPEATS``
    before, until, repeats = layout.get("calls_before", 0), layout.get("calls_until"), 0
    pickled = DUMPS(arguments, protocol=4) if before else b""
    while repeats < before and (until is None or CLOCK() < until):
        repeats += 1
        try:  # noqa: SIM105 (contextlib, a module the code under test can change, is not used here)
            call_as_a_user(module, qualname, kind, {**layout, "calls_before": 0}, LOADS(pickled))
        except Exception:  # only the last call's answer is judged
            pass
    if before:
        REPEATS.append(repeats)
    if kind == "property":
        return found.__get__(positional[0], type(positional[0]))
    if kind == "setter":
        return found.__set__(positional[0], positional[1])
    if kind == "classmethod":
        found = found.__func__
    return found(*positional, **keywords)


def exception(exc: BaseException) -> list:
    """An exception as a test that catches it sees it: its class (``class_path``), which
    ``pytest.raises`` tells from its built-in base, and its message (``str``, which ``match=`` reads:
    its first ``MESSAGE`` characters, without addresses); where making the message raises, the class
    of what it raised."""
    try:
        message = without_addresses(str.__str__(str(exc))[:MESSAGE])
    except Exception as failed:  # past its time, the interrupt is no Exception: the call's time bounds this
        message = ["str raised", class_path(type(failed))]
    return [class_path(type(exc)), message]


def class_path(kind: type) -> str:
    """A class as a test names it: ``module.qualname`` (a built-in by its name alone), read from the
    class itself, whatever its metaclass says of it; ``?`` for a module that is no text."""
    try:
        module = TYPE_MODULE(kind)
    except Exception:  # a class whose __module__ was taken out of its namespace
        module = None
    name = str.__str__(TYPE_QUALNAME(kind))
    if type(module) is not str:
        module = "?"
    return (name if module == "builtins" else module + "." + name)[:SHOWN]


def describe(value, depth: int = 0):
    """``value`` as plain data (text, lists, None and booleans), as ``==`` compares it: numbers that
    compare equal alike (``Number``: floats to twelve significant digits, each number's exact text
    beside), a subclass of str, int, float, list,
    tuple, dict (an OrderedDict apart) or set, and any other ``collections.abc.Mapping`` or ``Set``,
    as the built-in value it equals, containers as they are (a set or a dict in sorted order; a
    sequence's items past ``ITEMS`` in a digest), an
    iterator's first ``ITEMS`` items, a path as its text, another object as its type and attributes,
    ``__slots__`` included; no address, in a repr or in a text."""
    kind = type(value)
    name = class_path(kind)
    if value is None:
        return value
    if kind is bool:  # as == compares True with 1 and 1.0
        return Number(str(int(value)), str(int(value)))
    if isinstance(value, str):  # a str subclass compares as its text; an object's address in it is not kept
        return without_addresses(str.__str__(value))
    if isinstance(value, int):  # past 2**53 no float is near enough to matter: compared exactly
        text = int.__repr__(int.__int__(value))
        return Number(text, text) if abs(int.__int__(value)) < 2**53 else ["number", text]
    if isinstance(value, float):  # as == compares a float with the int it equals, and near the last digits
        number = float.__float__(value)
        whole = number.is_integer() and abs(number) < 2**53
        return Number(str(int(number)) if whole else format(number, ".12g"), float.__repr__(number))
    if kind is complex:
        return ["complex", repr(value)]
    if depth >= DEPTH:
        return ["deep", name]
    if isinstance(value, bytes | bytearray):  # its buffer, which no method of a subclass can change
        return [name, MEMORY(value).tobytes().hex()]
    if isinstance(value, range):  # described without being listed
        return [name, str(len(value)), [describe(item, depth + 1) for item in islice(value, ITEMS)]]
    # a subclass of a built-in container is described by what its built-in type holds, as == and
    # indexing read it, and also by what its own iteration gives where it changes that (a list whose
    # __iter__ and __len__ tell one story and whose items another is seen in both)
    base = next((each for each in BUILT_IN_CONTAINERS if isinstance(value, each)), None)
    told = [] if base is None or kind.__iter__ is base.__iter__ else [describe(iterated(value), depth + 1)]
    if isinstance(value, list | tuple) or name == "collections.deque":
        # a namedtuple compares as the tuple it is; every item counts, those past ITEMS in a digest
        held = list(base.__iter__(value))  # base: list, tuple, or the deque this is
        items = [describe(item, depth + 1) for item in held[:ITEMS]]
        rest = SHA(encoded([describe(item, depth + 1) for item in held[ITEMS:]]).encode()).hexdigest()
        return [base.__module__ + "." + base.__qualname__, str(len(held)), items, rest, *told]
    if isinstance(value, MAPPING):
        held = base.items(value) if base in (dict, ORDERED) else value.items()
        pairs = [[describe(key, depth + 1), describe(item, depth + 1)] for key, item in islice(held, ITEMS)]
        if isinstance(value, ORDERED):  # an OrderedDict (an LRU's order) as it is kept
            return [name, str(len(held)), pairs, *told]
        # any other mapping (a Counter, a defaultdict, one that is no dict: pyrsistent's PMap, whose
        # attributes are hash buckets laid out by the process's hash seed) as the dict it equals, in
        # sorted order, as == compares them
        return ["builtins.dict", str(len(held)), sorted(pairs, key=encoded), *told]
    if isinstance(value, SET):  # a set, a frozenset and any other set (a PSet, dict.keys()) of the same items are ==
        held = list(base.__iter__(value)) if base is not None else list(islice(value, ITEMS))
        items = [describe(item, depth + 1) for item in held[:ITEMS]]
        return ["builtins.set", str(len(held) if base is not None else len(value)), sorted(items, key=encoded), *told]
    if isinstance(value, BaseException):
        return ["exception", *exception(value)]
    if isinstance(value, PURE_PATH):  # as == compares paths: by their text, not the parts each caches once asked
        return [name, PURE_PATH.__str__(value)]
    if isinstance(value, NAMED):
        return [name, getattr(value, "__module__", None), getattr(value, "__qualname__", value.__name__)]
    if hasattr(kind, "__next__"):
        items = []
        try:
            for item in value:
                items.append(describe(item, depth + 1))
                if len(items) >= ITEMS:
                    break
        except Exception as exc:
            items.append(["raised", *exception(exc)])
        return [name, "iterator", items]
    state = getattr(value, "__dict__", None)
    state = dict(state) if isinstance(state, dict) else {}
    for owner in kind.__mro__:  # what __slots__ hold, which no __dict__ shows
        slots = owner.__dict__.get("__slots__", ())
        for slot in [slots] if isinstance(slots, str) else slots:
            if type(slot) is str and slot not in ("__dict__", "__weakref__") and hasattr(value, slot):
                state.setdefault(slot, getattr(value, slot))
    if state:
        return [name, describe({key: item for key, item in state.items() if type(key) is str}, depth + 1)]
    return [name, WITHOUT_ADDRESSES("0x", repr(value))[:1000]]


def iterated(value) -> list:
    """The first ``ITEMS`` items a container's own iteration gives (one whose ``__iter__`` a subclass
    changed), what it raised at the end where it raised."""
    items = []
    try:
        items.extend(islice(value, ITEMS))
    except Exception as exc:
        items.append(["raised", *exception(exc)])
    return ["iterated", items]


def without_addresses(text: str) -> str:
    """``text`` with the address of each object's default repr in it taken out."""
    return ADDRESS_IN_TEXT(" at 0x", text) if " at 0x" in text else text


class Number(list):
    """A number as a description holds it: ``["number", text]``, the text rounded to twelve significant
    digits (an int as it is), and its exact text (``exact``), which the answer can carry beside its
    digest (``encoded``)."""

    __slots__ = ("exact",)

    def __init__(self, rounded: str, exact: str):
        list.__init__(self, ("number", rounded))
        self.exact = exact


def encoded(value, numbers: list[str] | None = None) -> str:
    """A description (text, lists, None, booleans) as JSON, by these lines alone: ``json``'s encoder is
    a module the code under test can change. With ``numbers``, the first ``NUMBERS`` numbers
    (``Number``) are written ``["number"]``, their exact text appended to ``numbers``; the others
    rounded."""
    if type(value) is Number and numbers is not None and len(numbers) < NUMBERS:
        numbers.append(value.exact)
        return '["number"]'
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is str:
        return '"' + "".join(_escaped(char) for char in value) + '"'
    return "[" + ",".join(encoded(item, numbers) for item in value) + "]"


def _escaped(char: str) -> str:
    if char in ESCAPED:
        return ESCAPED[char]
    point = ord(char)
    if 0x20 <= point < 0x7F:
        return char
    if point < 0x10000:
        return f"\\u{point:04x}"
    point -= 0x10000
    return f"\\u{0xD800 + (point >> 10):04x}\\u{0xDC00 + (point & 0x3FF):04x}"


def variants(recorded: tuple, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """Up to ``count`` calls like the ``recorded`` one (module, qualified name, kind, layout,
    arguments) that leave its shape, pickled, each with what was moved as a person reads it: one
    argument moved (``moved``: a value near or far, of another type, or inside a container or an
    object), or the arguments that may be passed by name passed by name (``by_name``), each way in
    turn from a drawn start, and half the moved calls by name too; never ``self`` or ``cls``."""
    module, qualname, kind, layout, arguments = recorded
    skipped = 1 if kind in ("method", "classmethod", "property", "setter") else 0  # self or cls stays
    names = list(arguments)[skipped:]
    first, made = rng.randrange(len(WAYS)), []
    for turn in range(count):
        way = WAYS[(first + turn) % len(WAYS)]
        try:
            named = by_name(kind, layout, arguments, skipped, rng)
            if way == "by name" and named is not None:
                changed, shown = arguments, []
            else:  # one argument moved this way, or any way where none can be
                movable = [(name, new) for name in names if (new := moved(arguments[name], rng, way)) is not None]
                movable = movable or [
                    (name, new) for name in names if (new := moved_somehow(arguments[name], rng)) is not None
                ]
                if not movable:
                    continue
                name, new = rng.choice(movable)
                changed, shown = {**arguments, name: new}, [f"{name}={shown_briefly(new)}"]
                named = named if rng.random() < 0.5 else None
            if named is not None:
                shown.append(", ".join(name for name in named["keyword"] if name in arguments) + " by name")
            data = DUMPS((module, qualname, kind, named or layout, changed), protocol=4)
        except Exception:  # a value that cannot be moved, compared, shown or pickled: this call is not made
            continue
        made.append((TO_BASE64(data, newline=False).decode(), "; ".join(shown)))
    return made


WAYS = ("near", "other type", "inside", "by name")
MOVES = WAYS[:3]
MANY = 1000  # calls of the same made before one is answered again, at most
#: what making them may take: for one recorded call, and for all of a replay (``main``); the replay
#: of a change makes exactly as many, each within the call's time limit
REPEAT_SECONDS_A_CALL, REPEAT_SECONDS = 0.5, 2.0
CLOCK, COPY = time.perf_counter, copy.copy
REPEATS: list[int] = []  # how many calls of the same ``call_as_a_user`` made before the last one
MOVE_DEPTH = 6  # how deep in containers and objects a value is moved
#: containers whose own ``copy`` keeps their type and contents (a defaultdict its factory)
COPIED = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)


def made_again(recorded: tuple, times: int, until: float | None = None) -> tuple[str, str]:
    """The ``recorded`` call, pickled to be made after ``times`` calls of the same in its process
    (``call_as_a_user``: ``calls_before``; with ``until``, no more than fit before that ``CLOCK``
    time), as a person reads it."""
    module, qualname, kind, layout, arguments = recorded
    layout = {**layout, "calls_before": times, **({"calls_until": until} if until is not None else {})}
    data = DUMPS((module, qualname, kind, layout, arguments), protocol=4)
    return TO_BASE64(data, newline=False).decode(), f"after {times} calls of the same"


def by_name(kind: str, layout: dict, arguments: dict, skipped: int, rng: random.Random) -> dict | None:
    """``layout`` with the positional parameters from a drawn one on passed by name (``call_as_a_user``
    passes its ``keyword`` ones by name); None where none may be: a property, a call with ``*args``."""
    if kind in ("property", "setter") or (layout["varargs"] and arguments.get(layout["varargs"])):
        return None
    positional = layout["positional"]
    upto = next((at for at, name in enumerate(positional) if name not in arguments), len(positional))
    if upto <= skipped:
        return None
    cut = rng.randrange(skipped, upto)
    return {**layout, "positional": positional[:cut], "keyword": positional[cut:] + layout["keyword"]}


def moved_somehow(value, rng: random.Random, depth: int = 0):
    """``value`` moved in the first of the ways, in a drawn order, that can move it (``moved``)."""
    for way in rng.sample(MOVES, len(MOVES)):
        new = moved(value, rng, way, depth)
        if new is not None:
            return new
    return None


def moved(value, rng: random.Random, way: str = "near", depth: int = 0):
    """``value`` moved one ``way`` (``moving``), or None where it cannot be, or where moving it raised
    (a copy, a comparison or an attribute that the value's own code makes raise)."""
    try:
        return moving(value, rng, way, depth)
    except Exception:
        return None


def moving(value, rng: random.Random, way: str, depth: int):
    """``value`` moved one ``way``, or None where it cannot be: ``near`` (a number moved by one or two,
    doubled, negated, zeroed, moved by a thousand or divided by three; a text or a sequence shortened,
    turned round, lengthened, emptied or doubled; a dict's key or a set's item taken out or added),
    ``other type`` (an int as the float it equals or one near it, or as the bool it equals; a float as
    an int; a bool as an int; a list as a tuple and back; ASCII text as bytes and back; a set as a
    frozenset and back), or ``inside`` (one item of a list or tuple, one value of a dict or one
    attribute of an object moved, in a copy, any way, as deep as ``MOVE_DEPTH``)."""
    kind = type(value)
    if depth > MOVE_DEPTH:
        return None
    if kind is bool:
        return (not value) if way == "near" else int(value) if way == "other type" else None
    if kind in (int, float):
        if way == "other type":
            if kind is float:
                return int(value) if value == value and abs(value) != float("inf") else None
            return rng.choice([float(value), value + 0.5] + ([bool(value)] if value in (0, 1) else []))
        if way != "near":
            return None
        at = rng.randrange(6)
        near = kind((value + rng.choice((-2, -1, 1, 2)), value * 2, -value, value * 0, value + 1000, value // 3)[at])
        return near if near != value else value + kind(1)
    if kind in (str, bytes) and way == "other type":
        return (value.encode() if kind is str else value.decode()) if value.isascii() else None
    if kind in (list, tuple) and way == "other type":
        return (tuple if kind is list else list)(value)
    if kind in (list, tuple) and way == "inside":
        if not value:
            return None
        at = rng.randrange(len(value))
        item = moved_somehow(value[at], rng, depth + 1)
        return None if item is None else kind([*value[:at], item, *value[at + 1 :]])
    if kind in (str, bytes, list, tuple) and way == "near":
        if not value:
            return kind("0") if kind is str else kind(b"0") if kind is bytes else kind([0])
        near = (value[:-1], value[::-1], value + value[:1], value[:0], value + value)[rng.randrange(5)]
        return near if len(near) != len(value) or near != value else value[:-1]
    if kind is range:
        return range(value.start, value.stop + rng.choice((-1, 1, 50)), value.step) if way == "near" else None
    if kind in (set, frozenset):
        if way == "other type":
            return (frozenset if kind is set else set)(value)
        return moved_set(value, rng) if way == "near" else None
    if kind in COPIED:
        return moved_mapping(value, rng, way, depth)
    if way == "inside" and kind.__module__ != "builtins":
        return moved_attribute(value, rng, depth)
    return None


def moved_set(value, rng: random.Random):
    """A copy of the set ``value`` with one item taken out, or one added near another."""
    items = list(islice(value, ITEMS))
    if items and rng.random() < 0.5:
        return type(value)(set(value) - {rng.choice(items)})
    added = absent(items, value, rng)
    return None if added is None else type(value)(set(value) | {added})


def absent(items: list, value, rng: random.Random):
    """A key or an item not in ``value``: one of ``items`` moved near (a few tries), 0 where there are none."""
    if not items:
        return 0
    for _ in range(4):
        added = moved(rng.choice(items), rng)
        if added is not None and added not in value:
            return added
    return None


def moved_mapping(value, rng: random.Random, way: str, depth: int):
    """A copy of the dict ``value`` (of its own type) with one value moved (``inside``, any way), or
    one key taken out or one added near another, holding another's value (``near``)."""
    if way not in ("near", "inside") or not value:
        return None
    keys = list(islice(value, ITEMS))
    key = keys[rng.randrange(len(keys))]
    copied = value.copy()
    if way == "inside":
        item = moved_somehow(value[key], rng, depth + 1)
        if item is None:
            return None
        copied[key] = item
    elif rng.random() < 0.5:
        del copied[key]
    else:
        added = absent(keys, value, rng)
        if added is None:
            return None
        copied[added] = value[key]
    return copied


def moved_attribute(value, rng: random.Random, depth: int):
    """A copy of the object ``value`` (never the recorded one) with one of its attributes moved, any
    way; None for what holds no attributes of its own (a function, a class, a module)."""
    if isinstance(value, NAMED):
        return None
    state = object.__getattribute__(value, "__dict__")
    if type(state) is not dict or not state:
        return None
    names = [name for name in islice(state, ITEMS) if type(name) is str]
    name = names[rng.randrange(len(names))] if names else None
    item = moved_somehow(state[name], rng, depth + 1) if name is not None else None
    if item is None:
        return None
    copied = COPY(value)
    copied_state = object.__getattribute__(copied, "__dict__")
    if copied is value or copied_state is state or type(copied_state) is not dict:
        return None
    copied_state[name] = item
    return copied


def shown_briefly(value) -> str:
    """``value``'s repr, its first characters, as a reason shows a moved argument."""
    return format(repr(value), ".60")


if __name__ == "__main__":
    main()
