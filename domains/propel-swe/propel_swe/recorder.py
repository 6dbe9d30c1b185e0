"""The recorder: a pytest plugin that writes down the calls a bug's failing tests make into the
repository, on the clean checkout, for the replay (``replay``) to make again outside the tests.

It runs inside the sandbox on the unmodified checkout only (no change's code is loaded), so it
imports nothing but the standard library and pytest. pytest imports it through ``PYTEST_PLUGINS``;
it reads its orders from ``orders.json`` beside it (the tests to run, the repository's source files,
where to write, the limits) and deselects every other test. While a test's call phase runs, a
profile function sees each Python call; a call enters the repository at its boundary when its code
lives in one of the source files and its caller's does not (a test, a helper of the tests, pytest,
or C code the test called, such as ``list`` or ``map``). Such a call is recorded as the module that
defines its function, the function's qualified name, how a user reaches it by that name (``kind_of``:
the module's attribute, a method looked up on ``self``, ...), how it takes its arguments, and its
arguments as they were on entry, pickled; an argument that is a path in the test's temporary folder
(pytest's ``tmp_path``, as text or a ``PurePath``) is made relative to it, and the files that folder
holds as the call starts are recorded with it (``held``), so that the replayer, which makes each call
with a fresh folder of its own as its working directory, puts them there and finds there what the
call writes. A call whose arguments do not pickle is left out, and so is
a call of a function its name does not lead to (nested in another, or bound under another name), and
calls past the limits; how many were left out is written beside the calls. A generator's frame is
recorded on its first start only. The folders of the checkout on ``sys.path`` at the end are written
too: an argument may be an instance of a class a test module defines, which the replayer loads from
there.
"""

import base64
import json
import os
import pickle
import reprlib
import sys
from pathlib import Path, PurePath

import pytest

ORDERS_PATH = Path(__file__).resolve().parent / "orders.json"
ORDERS = json.loads(ORDERS_PATH.read_text())
ORDERS_PATH.unlink()
SOURCES = frozenset(ORDERS["sources"])
SELECT = frozenset(ORDERS["tests"])
MAX_CALLS, MAX_PER_TEST, MAX_BYTES = ORDERS["max_calls"], ORDERS["max_per_test"], ORDERS["max_bytes"]
GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR
SHOWN = reprlib.Repr()
SHOWN.maxstring, SHOWN.maxother, SHOWN.maxlist = 40, 40, 6
FOLDER_FILES, FOLDER_BYTES = 20, 16 << 10  # files of a test's temporary folder recorded with a call, their bytes

calls: list[dict] = []
size = skipped = 0  # bytes recorded; calls at the boundary not recorded
in_sources: dict[str, bool] = {}
kinds: dict = {}  # code object -> how a user reaches it and its defaults (``kind_of``)


def _ours(filename: str) -> bool:
    found = in_sources.get(filename)
    if found is None:
        found = in_sources[filename] = os.path.realpath(filename) in SOURCES
    return found


def layout(code) -> dict:
    """How a code object takes its arguments: the positional parameters in order, ``*args``, the
    keyword-only ones, ``**kwargs`` (what the replayer calls with, whatever the change renames)."""
    names, count = code.co_varnames, code.co_argcount + code.co_kwonlyargcount
    varargs = names[count] if code.co_flags & 0x04 else None  # CO_VARARGS
    varkw = names[count + bool(varargs)] if code.co_flags & 0x08 else None  # CO_VARKEYWORDS
    return {
        "positional": list(names[: code.co_argcount]),
        "varargs": varargs,
        "keyword": list(names[code.co_argcount : count]),
        "varkw": varkw,
    }


def running(target, code):
    """The function of ``target`` that runs ``code``: ``target`` itself, or one it wraps
    (``__wrapped__``); None where there is none."""
    for _ in range(8):
        if getattr(target, "__code__", None) is code:
            return target
        target = getattr(target, "__wrapped__", None)
    return None


def kind_of(module: str, code) -> tuple[str, dict] | None:
    """How a user reaches ``code`` by its qualified name in ``module``, on the clean checkout, and the
    function's defaults: a ``function`` (the module's attribute, or a class's static method), a
    ``method`` (the class's attribute, called with ``self``), a ``classmethod``, a ``property`` read
    or a ``setter``; None where the name does not lead to this code (a function bound under another
    name, one nested in another)."""
    if code in kinds:
        return kinds[code]
    *path, name = code.co_qualname.split(".")
    owner = sys.modules.get(module)
    for part in path:
        owner = getattr(owner, part, None)
    raw = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if isinstance(raw, property):
        ways = [("property", raw.fget), ("setter", raw.fset)]
    elif isinstance(raw, staticmethod) or (raw is not None and not isinstance(owner, type)):
        ways = [("function", getattr(raw, "__func__", raw))]
    elif isinstance(raw, classmethod):
        ways = [("classmethod", raw.__func__)]
    else:
        ways = [("method", raw)] if raw is not None and code.co_argcount else []
    found = next(((kind, running(target, code)) for kind, target in ways if running(target, code)), None)
    kinds[code] = found and (found[0], defaults(found[1], code))
    return kinds[code]


def defaults(function, code) -> dict:
    """The function's default values by parameter name."""
    names = code.co_varnames[: code.co_argcount]
    positional = function.__defaults__ or ()
    found = dict(zip(names[len(names) - len(positional) :], positional, strict=True))
    return {**found, **(function.__kwdefaults__ or {})}


def in_the_calls_folder(value, folder: str | None):
    """``value`` relative to the test's temporary folder ``folder`` where it is a path in it (text or a
    ``PurePath``); otherwise ``value``."""
    if folder is None or not (type(value) is str or isinstance(value, PurePath)):
        return value
    path = os.fspath(value)
    if path != folder and not path.startswith(folder + os.sep):
        return value
    relative = os.path.relpath(path, folder)
    try:
        return relative if type(value) is str else type(value)(relative)
    except Exception:  # a path class of the repository's that is not made from text
        return value


def held(folder: str) -> dict[str, bytes]:
    """The files ``folder`` holds, by name relative to it: the first ``FOLDER_FILES`` (in sorted order,
    folder by folder) whose contents fit ``FOLDER_BYTES`` in all; links and what is no file are not."""
    files, size = {}, 0
    for inside, folders, names in os.walk(folder):
        folders.sort()
        for name in sorted(names):
            path = os.path.join(inside, name)
            if len(files) >= FOLDER_FILES or os.path.islink(path) or not os.path.isfile(path):
                continue
            try:
                data = Path(path).read_bytes() if size + os.path.getsize(path) <= FOLDER_BYTES else None
            except OSError:  # gone, or not readable
                data = None
            if data is not None and size + len(data) <= FOLDER_BYTES:
                files[os.path.relpath(path, folder)] = data
                size += len(data)
    return files


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if item.nodeid in SELECT]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in SELECT])
    items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    started: list = []  # generator frames already recorded (kept alive, so their ids stay theirs)
    count = 0
    temporary = getattr(item, "funcargs", {}).get("tmp_path")  # pytest's, where the test asked for it
    folder = os.fspath(temporary) if isinstance(temporary, PurePath) else None

    def profile(frame, event, arg):
        nonlocal count
        global size, skipped
        if event != "call":
            return
        code, caller = frame.f_code, frame.f_back
        if not _ours(code.co_filename) or caller is None or _ours(caller.f_code.co_filename):
            return
        if code.co_flags & GENERATOR_FLAGS:
            if any(seen is frame for seen in started):
                return
            started.append(frame)
        module = frame.f_globals.get("__name__")
        # nested in a function, a lambda or a comprehension: no name to call it by
        reached = None if "<" in code.co_qualname else kind_of(module, code)
        data = None
        if reached is not None and count < MAX_PER_TEST and len(calls) < MAX_CALLS:
            (kind, default), values, taken = reached, frame.f_locals, layout(code)
            names = [*taken["positional"], taken["varargs"], *taken["keyword"], taken["varkw"]]
            if taken["varargs"] and values.get(taken["varargs"]):  # every positional one was passed
                default = {name: value for name, value in default.items() if name in taken["keyword"]}
            # a value that is its parameter's default was not passed, as far as anyone can tell: left
            # out, so that the replay meets the function's own default (a bug may change it)
            arguments = {
                name: in_the_calls_folder(values[name], folder)
                for name in names
                if name is not None and name in values and not (name in default and values[name] is default[name])
            }
            if any(arguments[name] is not values[name] for name in arguments):  # a path in the test's folder
                taken["folder"] = held(folder)  # what the replayer puts in the call's folder before the call
            try:
                data = pickle.dumps((module, code.co_qualname, kind, taken, arguments), protocol=4)
            except Exception:  # not every argument pickles (a generator, a lambda, a module)
                data = None
        if data is None or size + len(data) > MAX_BYTES:
            skipped += 1
            return
        shown = ", ".join(f"{name}={SHOWN.repr(value)}" for name, value in arguments.items())
        calls.append({"call": base64.b64encode(data).decode(), "shown": f"{code.co_qualname}({shown})"})
        size += len(data)
        count += 1

    sys.setprofile(profile)
    try:
        return (yield)
    finally:
        sys.setprofile(None)


def pytest_sessionfinish(session, exitstatus):
    root = os.path.realpath(ORDERS["root"])
    paths = [os.path.relpath(os.path.realpath(path), root) for path in sys.path if path]
    inside = [path for path in paths if path == "." or not path.startswith("..")]  # pytest's test folders among them
    Path(ORDERS["out"]).write_text(json.dumps({"calls": calls, "skipped": skipped, "paths": inside}))
