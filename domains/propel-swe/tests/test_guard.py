"""The guard on its own, in a fresh interpreter (an audit hook cannot be removed, so never in this
one): what the change's code may not do is refused, what the repository's own code does is not, the
standard library's harmless uses of a frame go through, and every refusal is counted."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from propel_swe import guard

CHECKOUT = {
    "pkg/__init__.py": """\
import collections
import gc
import logging
import os
import signal
import sys
import threading


def original():  # the repository's own code: six's exec_ takes its caller's frame like this
    return sys._getframe(1) is not None


def frame():
    return sys._getframe(0)


def garbage():
    return len(gc.get_objects())


def traceback_frame():
    try:
        raise LookupError
    except LookupError:
        return sys.exc_info()[2].tb_frame


def handler():
    signal.signal(signal.SIGUSR1, {}.__setitem__)


def the_tests():
    return open("tests/test_pkg.py").read()


def the_tests_by_a_second_name():  # a hard link to a test file, opened by the link's name
    os.link("tests/test_pkg.py", "pkg/notes.txt")
    return open("pkg/notes.txt").read()


def guard_asked():  # the guard's event raised by the change itself: a plain process answers nothing
    box = []
    sys.audit("propel." + "guard", "asks", (), {}, box)
    return box


def code_of_the_guard():  # what its functions run, to be run again with cells of the change's making
    return signal.signal.__code__


def process():
    import subprocess
    return subprocess.run(["true"]).returncode


def proc():
    return open("/proc/self/status").read()


def thread():
    found = []
    worker = threading.Thread(target=sys._current_frames)
    worker.start()
    worker.join()
    return found


def memory():
    import ctypes
    return ctypes


def code_of_a_test():
    return sys.modules["tests.test_pkg"].test_one.__code__


def compiled_later():
    scope = {}
    exec("import sys\\ndef later():\\n    return sys._getframe(0)", scope)
    return scope["later"]


def fresh_thread_module():
    import importlib.util
    spec = importlib.util.find_spec("_thread")
    return importlib.util.module_from_spec(spec)


def process_without_popen():
    import subprocess
    return subprocess._fork_exec()  # refused before its arguments are read


def test_module_class_swapped():
    import types

    class Module(types.ModuleType):
        pass

    sys.modules["tests.test_pkg"].__class__ = Module


def guarded(name):
    return getattr(sys.modules[name.rpartition(".")[0]], name.rpartition(".")[2])


WRAPPERS = ("signal.signal", "_thread.start_new_thread", "_imp.create_builtin", "subprocess._fork_exec")


def in_reach():  # everything the guard's wrappers lead to through closures and globals
    found, pending, seen = [], [guarded(name) for name in WRAPPERS], set()
    while pending:
        value = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        found.append(value)
        pending += [cell.cell_contents for cell in getattr(value, "__closure__", None) or ()]
        if callable(value) and type(getattr(value, "__globals__", None)) is dict:
            pending += [v for v in value.__globals__.values() if callable(v)]
    return found


def handler_through_a_closure():  # the original signal.signal, if a wrapper's cells or globals hold it
    setter = next((v for v in in_reach() if getattr(v, "__module__", "") == "_signal" and v.__name__ == "signal"), None)
    (setter or signal.signal)(signal.SIGUSR1, {}.__setitem__)


def guard_state_cleared():  # the guard's state, if in reach, emptied (the change's lines forgotten)
    for value in in_reach():
        if type(value) in (dict, set, list):
            value.clear()
    return sys._getframe(0)


def builtins_poisoned():  # the builtins the guard's functions read, if in reach: any() always False
    for value in in_reach():
        for space in (getattr(value, "__globals__", None), getattr(value, "__builtins__", None)):
            if type(space) is dict:
                inner = space.get("__builtins__", space)
                if type(inner) is dict:
                    inner["any"] = lambda found: False
    return sys._getframe(0)


def code_swapped_through_functools():  # the repository's function given the change's code, by functools
    import functools

    functools.update_wrapper(original, frame, assigned=("__code__",), updated=())


def class_swapped_through_functools():  # a test module given a class the change wrote, by functools
    import functools
    import types

    class Module(types.ModuleType):
        pass

    functools.update_wrapper(sys.modules["tests.test_pkg"], Module("x"), assigned=("__class__",), updated=())


def harmless():
    import asyncio  # noqa: F401  (imports _posixsubprocess for itself)
    import traceback
    logging.getLogger("pkg").warning("logged")
    try:
        raise ValueError("own")
    except ValueError:
        text = traceback.format_exc()
    return collections.namedtuple("Pair", "a b")(1, 2).a + ("own" in text)
""",
    "tests/__init__.py": "",
    "tests/test_pkg.py": "def test_one():\n    assert True\n",
}
WRITTEN = [  # the functions the change wrote: every one after original()
    "frame", "garbage", "traceback_frame", "handler", "the_tests", "the_tests_by_a_second_name", "guard_asked",
    "code_of_the_guard", "process", "proc", "thread", "memory",
    "code_of_a_test", "compiled_later", "fresh_thread_module", "process_without_popen", "test_module_class_swapped",
    "handler_through_a_closure", "guard_state_cleared", "builtins_poisoned", "code_swapped_through_functools",
    "class_swapped_through_functools", "harmless",
]  # fmt: skip
PROBE = """
import importlib, json, sys
sys.path[:0] = [{root!r}, {guard_dir!r}]
guard = importlib.import_module("guard")
intact = guard.watch(("json",))
refusals, asks = guard.install({root!r}, {written!r})
import pkg, tests.test_pkg
found = {{"original": repr(pkg.original())}}
for name in {names!r}:
    try:
        found[name] = "allowed: " + repr(getattr(pkg, name)())[:40]
    except Exception as exc:
        found[name] = f"{{type(exc).__name__}}: {{exc}}"
later = pkg.compiled_later
try:
    found["compiled_later()()"] = "allowed: " + repr(later()())[:40]
except Exception as exc:
    found["compiled_later()()"] = type(exc).__name__
found["refusals"] = len(refusals())
found["asks, from the runner"] = asks()
encode = json.JSONEncoder.encode
json.JSONEncoder.encode = lambda self, o: "forged"
found["watch"] = intact()
json.JSONEncoder.encode = encode
found["guard module importable by name"] = "guard" in sys.modules
print(json.dumps(found))
"""


def probe(tmp_path: Path) -> dict:
    root = tmp_path / "checkout"
    for path, text in CHECKOUT.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    lines = CHECKOUT["pkg/__init__.py"].splitlines()
    start = next(n for n, line in enumerate(lines, 1) if line.startswith("def frame"))
    written = {"pkg/__init__.py": list(range(start, len(lines) + 1))}
    script = PROBE.format(root=str(root), guard_dir=str(Path(guard.__file__).parent), written=written, names=WRITTEN)
    (tmp_path / "probe.py").write_text(textwrap.dedent(script))  # a file: "<string>" is what the change compiles
    done = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py")], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_guard_refuses_the_change_what_it_leaves_the_repository(tmp_path):
    found = probe(tmp_path)
    assert found["original"] == "True"  # the repository's own code keeps its frames
    refused = {name: found[name] for name in WRITTEN if not found[name].startswith("allowed")}
    assert set(refused) == set(WRITTEN) - {"thread", "harmless", "compiled_later", "guard_asked"}, {
        **found,
        "harmless": found["harmless"],
    }
    assert all(text.startswith("Refused: the code under test may not") for text in refused.values()), refused
    assert found["thread"] == "allowed: []"  # started, but the thread's own frame walk was refused
    assert found["guard_asked"] == "allowed: []"  # answered only to its own functions (before: [True])
    # logging's caller, namedtuple's module and a formatted traceback need a frame; asyncio, _posixsubprocess
    assert found["harmless"] == "allowed: 2"
    assert found["compiled_later()()"] == "Refused"  # code it compiled is its own, called later
    assert found["refusals"] >= len(refused) + 2
    assert found["watch"] == ["json.encoder.JSONEncoder.encode"]
    assert found["guard module importable by name"] is False
    assert found["asks, from the runner"] is False


#: a module of the repository that loads a C library at its top, as many real packages do
WITH_CTYPES = """\
import ctypes
import re

PATTERN = re.compile("a+")
LIBC = ctypes.CDLL(None)


def count(text):
    return len(PATTERN.findall(text)) + (LIBC is not None)
"""
IMPORT_IT = """
import importlib, sys
sys.path[:0] = [{root!r}, {guard_dir!r}]
guard = importlib.import_module("guard")
guard.install({root!r}, {{"pkg/lib.py": {written!r}}})
try:
    import pkg.lib
    print("imported", pkg.lib.count("aa a"))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def import_under_the_guard(tmp_path: Path, written: list[int]) -> str:
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "lib.py").write_text(WITH_CTYPES)
    script = IMPORT_IT.format(root=str(root), guard_dir=str(Path(guard.__file__).parent), written=written)
    (tmp_path / "probe.py").write_text(script)
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_change_to_one_line_of_a_module_does_not_make_its_own_imports_the_changes(tmp_path):
    """A module's top level is judged by the line it runs: rewriting its ``re.compile`` line leaves
    the module's own ``import ctypes`` and ``ctypes.CDLL`` the repository's; a written ``import
    ctypes`` line, or a written line that loads a library, is still the change's and refused."""
    assert import_under_the_guard(tmp_path / "a", [4]) == "imported 3"
    assert import_under_the_guard(tmp_path / "b", [1]).startswith("Refused the code under test may not import ctypes")
    assert import_under_the_guard(tmp_path / "c", [5]).startswith("Refused the code under test may not ctypes.dlopen")
