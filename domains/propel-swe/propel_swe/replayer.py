"""The replayer: the calls a bug's failing tests made into the repository (``recorder``), made again
in a process that holds no verdict, on a copy of a fresh checkout made for it.

It runs inside the sandbox as ``python REPLAYER ORDERS`` in the tests' environment, from a
folder and file named per run, as the second runner does: it reads its orders (the pickled calls,
the nonce and descriptor to answer on, the guard's module, the lines the change wrote, the time a
call may take, and a seed where it should also make calls of its own), deletes them, puts an empty
module in place of ``__main__``, installs the guard and makes what the code under test reads of its
process a plain run's (``guard.as_a_user``: the string hash seed the harness starts it with,
``PYTHONHASHSEED``, out of ``os.environ``) before any code of the repository is loaded.
Then, for each call in order, it loads the call's arguments and calls what a user reaches by the
function's name: the module's or the class's attribute of that name (a method with ``self`` first, a
classmethod with the call's own ``cls``, a property read or set), with the arguments laid out as the
original function took them (``recorder``). It describes what came of it as data, as a test compares
it (``describe``): the value returned (values that ``==`` makes equal alike whatever their class: a
float and the int it equals, a str subclass and its text, a Counter, or a mapping that is no dict,
and the dict it equals; floats
to twelve significant digits; every item of a sequence, the first ``ITEMS`` in full and the rest in a
digest; an object's attributes, ``__slots__`` included; never an address, in a repr or in a text) or
the nearest built-in type of the exception raised, the arguments as the call left
them (a method's effect on ``self``), the warnings it gave and what it printed. It writes, on the
descriptor, one line: ``NONCE`` and a JSON list with, per call, a digest of that description and its
first characters. With a seed, after each recorded call
it makes ``variants`` calls of its own whose arguments differ from the recorded ones in one value (a
number moved near or far, negated or zeroed; a string or a sequence shortened, turned round,
lengthened or emptied) and answers them too, in the order it made them, and writes their pickles
(with the recorded call each follows), so that the harness can make the same calls again elsewhere.
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
import hashlib
import importlib
import io
import json
import os
import pickle
import random
import re
import sys
import types
import warnings
from itertools import islice
from pathlib import Path

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
DESCRIBED = 3
PRINTED = 10_000  # characters of what a call printed that its description keeps
STRING_IO, ORDERED = io.StringIO, collections.OrderedDict
MAPPING, SET = collections.abc.Mapping, collections.abc.Set
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
    guard.as_a_user(os.path.dirname(os.path.realpath(__file__)), None, hashing, orders.get("argv"))
    del guard
    answers, made, size, late = [], [], 0, False
    rng = random.Random(seed)
    for index, call in enumerate(calls):
        if late and orders.get("stop_when_late"):  # one call past its time: the rest is not reached
            answers.append([SHA(NOT_REACHED.encode()).hexdigest(), NOT_REACHED])
            continue
        answers.append(replay(call, orders["time_limit"], within, refusals, out_of_time))
        late = late or answers[-1][1] == TIMEOUT
        if seed is None or late:  # no calls of its own once one has run out of time: what it costs is bounded
            continue
        try:
            moved_calls = variants(call, rng, orders.get("variants", 2))
        except Exception:  # the recorded call does not load: nothing to move
            moved_calls = []
        for variant, shown in moved_calls:
            size += len(variant)
            if size > MADE_BYTES:
                break
            made.append([variant, shown, str(index)])
            answers.append(replay(variant, orders["time_limit"], within, refusals, out_of_time))
            if answers[-1][1] == TIMEOUT:
                late = True
                break
    data = (nonce + " " + encoded([answers, made]) + "\n").encode()
    while data:
        data = data[WRITE(fd, data) :]


def replay(call: str, seconds: float, within, refusals, out_of_time) -> list[str]:
    """[digest, first characters] of what came of one call (``describe``): what it returned or
    raised, its arguments as it left them, and the warnings it gave (category and text)."""
    before = len(refusals())
    try:
        with within(seconds):
            module, qualname, kind, layout, arguments = LOADS(FROM_BASE64(call))
            printed, streams = STRING_IO(), (sys.stdout, sys.stderr)
            with CATCH_WARNINGS(record=True) as warned:
                WARN_ALWAYS("always")
                sys.stdout = sys.stderr = printed
                try:
                    returned = ["returned", describe(call_as_a_user(module, qualname, kind, layout, arguments))]
                except Exception as exc:  # past its time, the call is interrupted (no Exception): ``within``
                    returned = ["raised", built_in_kind(exc)]  # not its message: a right fix may word it otherwise
                finally:
                    sys.stdout, sys.stderr = streams
            given = [[built_in_kind(each.message), WITHOUT_ADDRESSES("0x", str(each.message))[:200]] for each in warned]
            said = without_addresses(printed.getvalue()[:PRINTED])
            description = encoded([returned, describe(arguments), given, said])
    except out_of_time:
        description = TIMEOUT
    except BaseException as exc:  # it could not be loaded or found, or it left by SystemExit
        description = encoded([NOT_REPLAYED, type(exc).__name__])
    if len(refusals()) > before:  # the change asked the guard for something while this call ran
        description = REFUSED
    return [SHA(description.encode()).hexdigest(), description[:SHOWN]]


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
    if kind == "property":
        return found.__get__(positional[0], type(positional[0]))
    if kind == "setter":
        return found.__set__(positional[0], positional[1])
    if kind == "classmethod":
        found = found.__func__
    return found(*positional, **keywords)


def built_in_kind(exc: BaseException) -> str:
    """The nearest built-in type of an exception (a ``StatisticsError`` is a ``ValueError``): what a
    test that expects the original's exception accepts of a subclass."""
    return next(kind.__qualname__ for kind in type(exc).__mro__ if kind.__module__ == "builtins")


def describe(value, depth: int = 0):
    """``value`` as plain data (text, lists, None and booleans), as ``==`` compares it: numbers that
    compare equal alike (floats to twelve significant digits), a subclass of str, int, float, list,
    tuple, dict (an OrderedDict apart) or set, and any other ``collections.abc.Mapping`` or ``Set``,
    as the built-in value it equals, containers as they are (a set or a dict in sorted order; a
    sequence's items past ``ITEMS`` in a digest), an
    iterator's first ``ITEMS`` items, another object as its type and attributes, ``__slots__``
    included; no address, in a repr or in a text."""
    kind = type(value)
    name = kind.__module__ + "." + kind.__qualname__
    if value is None or kind is bool:
        return value
    if isinstance(value, str):  # a str subclass compares as its text; an object's address in it is not kept
        return without_addresses(str.__str__(value))
    if isinstance(value, int):
        return ["number", int.__repr__(value)]
    if isinstance(value, float):  # as == compares a float with the int it equals, and near the last digits
        number = float.__float__(value)
        whole = number.is_integer() and abs(number) < 2**53
        return ["number", str(int(number)) if whole else format(number, ".12g")]
    if kind is complex:
        return ["complex", repr(value)]
    if depth >= DEPTH:
        return ["deep", name]
    if isinstance(value, bytes | bytearray):
        return [name, bytes(value).hex()]
    if isinstance(value, range):  # described without being listed
        return [name, str(len(value)), [describe(item, depth + 1) for item in islice(value, ITEMS)]]
    if isinstance(value, list | tuple) or name == "collections.deque":
        # a namedtuple compares as the tuple it is; every item counts, those past ITEMS in a digest
        base = next((each for each in (list, tuple) if isinstance(value, each)), kind)
        items = [describe(item, depth + 1) for item in islice(value, ITEMS)]
        rest = SHA(encoded([describe(item, depth + 1) for item in islice(value, ITEMS, None)]).encode()).hexdigest()
        return [base.__module__ + "." + base.__qualname__, str(len(value)), items, rest]
    if isinstance(value, MAPPING):
        pairs = [[describe(key, depth + 1), describe(item, depth + 1)] for key, item in islice(value.items(), ITEMS)]
        if isinstance(value, ORDERED):  # an OrderedDict (an LRU's order) as it is kept
            return [name, str(len(value)), pairs]
        # any other mapping (a Counter, a defaultdict, one that is no dict: pyrsistent's PMap, whose
        # attributes are hash buckets laid out by the process's hash seed) as the dict it equals, in
        # sorted order, as == compares them
        return ["builtins.dict", str(len(value)), sorted(pairs, key=encoded)]
    if isinstance(value, SET):  # a set, a frozenset and any other set (a PSet, dict.keys()) of the same items are ==
        items = [describe(item, depth + 1) for item in islice(value, ITEMS)]
        return ["builtins.set", str(len(value)), sorted(items, key=encoded)]
    if isinstance(value, BaseException):
        return [built_in_kind(value), describe(value.args, depth + 1)]
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
            items.append(["raised", built_in_kind(exc)])
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


def without_addresses(text: str) -> str:
    """``text`` with the address of each object's default repr in it taken out."""
    return ADDRESS_IN_TEXT(" at 0x", text) if " at 0x" in text else text


def encoded(value) -> str:
    """A description (text, lists, None, booleans) as JSON, by these lines alone: ``json``'s encoder is
    a module the code under test can change."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is str:
        return '"' + "".join(_escaped(char) for char in value) + '"'
    return "[" + ",".join(encoded(item) for item in value) + "]"


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


def variants(call: str, rng: random.Random, count: int) -> list[tuple[str, str]]:
    """Up to ``count`` calls like ``call`` with one argument moved (``moved``), pickled, each with what
    was moved as a person reads it; never ``self`` or ``cls``."""
    module, qualname, kind, layout, arguments = LOADS(FROM_BASE64(call))
    skipped = 1 if kind in ("method", "classmethod", "property", "setter") else 0  # self or cls stays
    names = [name for name in list(arguments)[skipped:] if moved(arguments[name], rng) is not None]
    made = []
    for _ in range(count if names else 0):
        name = rng.choice(names)
        changed = {**arguments, name: moved(arguments[name], rng)}
        try:
            data = DUMPS((module, qualname, kind, layout, changed), protocol=4)
        except Exception:
            continue
        made.append((TO_BASE64(data, newline=False).decode(), f"{name}={changed[name]!r:.60}"))
    return made


def moved(value, rng: random.Random):
    """A value of ``value``'s type, near it or far from it and not equal to it, or None where there
    is none to make."""
    kind = type(value)
    if kind is bool:
        return not value
    if kind in (int, float):
        way = rng.randrange(6)
        near = (value + rng.choice((-2, -1, 1, 2)), value * 2, -value, value * 0, value + 1000, value // 3)[way]
        near = kind(near)
        return near if near != value else value + kind(1)
    if kind in (str, bytes, list, tuple):
        if not value:
            return kind("0") if kind is str else kind(b"0") if kind is bytes else kind([0])
        way = rng.randrange(5)
        near = (value[:-1], value[::-1], value + value[:1], value[:0], value + value)[way]
        return near if near != value else value[:-1]
    if kind is range:
        return range(value.start, value.stop + rng.choice((-1, 1, 50)), value.step)
    return None


if __name__ == "__main__":
    main()
