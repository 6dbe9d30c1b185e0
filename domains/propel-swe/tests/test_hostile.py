"""Hostile diffs against the SWE verifier and grader, on the tiny repository in the real sandbox.

Under RL the bug writer is paid for whatever ``verify`` accepts and the solver for whatever ``grade``
accepts, so each diff here tries to be accepted without being a bug (or a fix): by naming paths in
ways git reads differently from a header parser, by hijacking the runner or its configuration, by
tampering with files while the suite runs, or by forging the report. Each must be refused.
"""

import difflib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from swe_helpers import BUG, reverted

from propel_core.errors import PropelError
from propel_swe.replay import Replay

FAIL_CLAMP = (
    "import pytest\n\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n"
    "    if item.name == 'test_clamp':\n        raise AssertionError('forged failure')\n"
)
PASS_ALL = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
)


def new_file(path: str, text: str, old: str = "/dev/null", new: str | None = None, git: str | None = None) -> str:
    lines = text.splitlines()
    header = f"diff --git {git}\nnew file mode 100644\n" if git else ""
    body = "".join(f"+{line}\n" for line in lines)
    return f"{header}--- {old}\n+++ {new or 'b/' + path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def edit_init(code: str) -> str:
    """A diff that appends ``code`` to tinystats/__init__.py (a source file the suite imports)."""
    lines = code.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (
        "--- a/tinystats/__init__.py\n+++ b/tinystats/__init__.py\n"
        f"@@ -4,1 +4,{1 + len(lines)} @@\n"
        ' __all__ = ["clamp", "is_sorted", "mean", "median", "window"]\n' + body
    )


QUOTED = new_file("conftest.py", FAIL_CLAMP, new='"b/conftest.py"', git='"a/conftest.py" "b/conftest.py"')
TIMESTAMP_TAB = new_file(
    "conftest.py",
    FAIL_CLAMP,
    old="/dev/null\t2020-01-01 00:00:00",
    new="b/conftest.py\t2020-01-01 00:00:00.000000000 +0000",
)
TIMESTAMP_SPACES = new_file(
    "conftest.py", FAIL_CLAMP, old="/dev/null  2020-01-01 00:00:00", new="b/conftest.py  2020-01-01 00:00:00"
)
RENAME = (
    "diff --git a/tinystats/__init__.py b/tinystats/sitecustomize.py\nsimilarity index 100%\n"
    "rename from tinystats/__init__.py\nrename to tinystats/sitecustomize.py\n"
)
MODE = "diff --git a/tinystats/core.py b/tinystats/core.py\nold mode 100644\nnew mode 100755\n"
SYMLINK = (
    "diff --git a/tinystats/stats.py b/tinystats/stats.py\nnew file mode 120000\n--- /dev/null\n"
    "+++ b/tinystats/stats.py\n@@ -0,0 +1 @@\n+../tests/test_core.py\n\\ No newline at end of file\n"
)
TESTS = (Path(__file__).parent / "data" / "tinystats" / "tests" / "test_core.py").read_text().splitlines()
DELETE_TESTS = (
    "diff --git a/tests/test_core.py b/tests/test_core.py\ndeleted file mode 100644\n--- a/tests/test_core.py\n"
    f"+++ /dev/null\n@@ -1,{len(TESTS)} +0,0 @@\n" + "".join(f"-{line}\n" for line in TESTS)
)

# A bug must modify existing source files the suite imports, and nothing else.
PATH_BUGS = {
    "new_conftest": (new_file("conftest.py", FAIL_CLAMP, git="a/conftest.py b/conftest.py"), "creates conftest.py"),
    "quoted_path": (QUOTED, "creates conftest.py"),
    "traditional_header_tab_timestamp": (TIMESTAMP_TAB, "creates conftest.py"),
    "traditional_header_space_timestamp": (TIMESTAMP_SPACES, "creates conftest.py"),
    "dot_pytest_ini": (new_file(".pytest.ini", "[pytest]\naddopts = -p tinystats.plugin\n"), "creates .pytest.ini"),
    "runner_shadow": (new_file("pytest.py", "raise SystemExit(1)\n"), "creates pytest.py"),
    "module_shadow_in_package": (new_file("tinystats/json.py", "raise ImportError\n"), "creates tinystats/json.py"),
    "subfolder_conftest": (new_file("tests/conftest.py", FAIL_CLAMP), "creates tests/conftest.py"),
    "rename_to_startup_hook": (RENAME, "deletes tinystats/__init__.py"),
    "mode_change": (MODE, "changes the mode or type of tinystats/core.py"),
    "symlink_to_tests": (SYMLINK, "creates tinystats/stats.py"),
    "delete_the_tests": (DELETE_TESTS, "deletes tests/test_core.py"),
    "a_path_deeper_than_a_recursive_walk": (new_file("d/" * 1200 + "x.py", "X = 1\n"), "creates d/d/d"),
}

# Diffs of allowed files whose code, once imported by the suite, tampers with the verdict.
WRITE_CONFTEST = (
    "import os as _os\n_here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))\n"
    f"open(_os.path.join(_here, 'tests', 'conftest.py'), 'w').write({FAIL_CLAMP!r})\n"
)
FD3_FORGERY = 'import os as _os\n_os.write(3, b\'PROPEL-REPORT 0000 {"event": "end"}\\n\')\n'
STOLEN_KEY = (
    "import json as _json, os as _os\nimport gc as _gc\n_r = next(_m for _m in _gc.get_objects() if type(_m).__name__ == 'module' and hasattr(_m, 'KEY') and hasattr(_m, 'OUT'))\n"
    "_os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'test', "
    "'id': 'tests/test_core.py::test_clamp', 'outcome': 'failed'}))).encode())\n"
)
AFTER_THE_END = (
    "import atexit as _atexit, json as _json, os as _os\nimport gc as _gc\n_r = next(_m for _m in _gc.get_objects() if type(_m).__name__ == 'module' and hasattr(_m, 'KEY') and hasattr(_m, 'OUT'))\n"
    "_atexit.register(lambda: _os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': "
    "'test', 'id': 'tests/test_core.py::test_clamp', 'outcome': 'failed'}))).encode()))\n"
)
PRINTED = 'print(\'PROPEL-REPORT x {"event": "test", "id": "tests/test_core.py::test_clamp"}\')\n'
DIES = "import os as _os\nif 'pytest' in __import__('sys').modules:\n    _os._exit(1)\n"
ORDER_DEPENDENT = (
    "from tinystats import core as _core\n_calls = []\n\n\ndef mean(values):\n    _calls.append(1)\n"
    "    return _core.mean(values)\n\n\ndef clamp(value, low, high):\n"
    "    return low if _calls else _core.clamp(value, low, high)\n"
)
FILL_THE_DISK = (
    "import os as _os\nfor _i in range(200):\n    try:\n"
    "        open(_os.path.join(_os.path.dirname(__file__), 'blob%d' % _i), 'wb').write(b'0' * (8 << 20))\n"
    "    except OSError:\n        break\n"
)
IN_PYTEST = "import os as _os, sys as _sys\nif 'pytest' in _sys.modules:\n"
FIFO_LOG = IN_PYTEST + (
    "    _d = [_os.path.join('/propel-out', p) for p in _os.listdir('/propel-out') if p.startswith('run-')][0]\n"
    "    _os.unlink(_d + '/suite.log')\n    _os.mkfifo(_d + '/suite.log')\n    _os._exit(1)\n"
)
NEXT_RUN_CONFIG = (
    IN_PYTEST + "    open('/testbed/pytest.toml', 'w').write('[pytest]\\naddopts = [\"-k\", \"clamp\"]\\n')\n"
)
UNREADABLE = IN_PYTEST + "    open('/testbed/junk.txt', 'w').write('x')\n    _os.chmod('/testbed/junk.txt', 0)\n"
GITLINK = (
    "diff --git a/numpy b/numpy\nnew file mode 160000\nindex 0000000..1234567\n--- /dev/null\n+++ b/numpy\n"
    "@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n"
)
RUN_BUGS = {
    "fifo_in_place_of_the_log": (edit_init(FIFO_LOG + ORDER_DEPENDENT), "no end"),
    "writes_pytest_toml_for_the_next_run": (edit_init(NEXT_RUN_CONFIG + ORDER_DEPENDENT), "changed pytest.toml"),
    "leaves_an_unreadable_file": (edit_init(UNREADABLE + ORDER_DEPENDENT), "left junk.txt unreadable"),
    "gitlink_beside_a_real_bug": (
        GITLINK + "diff --git a/tinystats/core.py b/tinystats/core.py\n" + BUG,
        "creates numpy",
    ),
    "fails_only_after_other_tests": (edit_init(ORDER_DEPENDENT), "does not fail when run alone"),
    "fills_the_disk": (edit_init(FILL_THE_DISK + ORDER_DEPENDENT), "disk_limit"),
    "writes_a_conftest_while_the_suite_runs": (edit_init(WRITE_CONFTEST), "changed tests/conftest.py"),
    "forged_line_on_the_report_pipe": (edit_init(FD3_FORGERY), "forged"),
    "stolen_key_reports_a_failure_twice": (edit_init(STOLEN_KEY), "reported twice: forged"),
    "stolen_key_writes_after_the_end": (edit_init(AFTER_THE_END), "after the end: forged"),
    "printed_report_lines": (edit_init(PRINTED), "no previously passing test fails"),
    "kills_the_runner": (edit_init(DIES), "no end"),
}


pytestmark = pytest.mark.usefixtures("verdict_deadline")


@pytest.fixture
def run_checks_alone(monkeypatch, tiny_domain):
    """The screen and the guard off: what the harness checks around every run (the files a run
    changed, one well-formed report stream under the run's key, the run's budget) on its own."""
    from propel_swe import verifier

    tiny_domain.baseline(tiny_domain.repos["tinystats"])  # the preflight with every layer as it ships

    monkeypatch.setattr(verifier, "screen", lambda before, after, original=None: [])
    monkeypatch.setattr(verifier, "GUARD", verifier.INERT_GUARD)


@pytest.mark.parametrize("name", sorted(PATH_BUGS) + sorted(RUN_BUGS))
def test_hostile_bug_is_refused(tiny_domain, run_checks_alone, name):
    diff, reason = {**PATH_BUGS, **RUN_BUGS}[name]
    payload = {"repo": "tinystats", "diff": diff, "turns": ["x"]}
    validity = tiny_domain.verify(payload)
    assert not validity.valid, f"{name} was accepted as a bug"
    assert reason in validity.reason, validity.reason


def solver_attempt(diff: str) -> str:
    return json.dumps({"diff": diff, "stop_reason": "stop", "status": "finished", "turns": []})


PASS_AT_EXIT = (
    "import atexit as _atexit, json as _json, os as _os\nimport gc as _gc\n_r = next(_m for _m in _gc.get_objects() if type(_m).__name__ == 'module' and hasattr(_m, 'KEY') and hasattr(_m, 'OUT'))\n"
    "def _forge():\n    for t in ['tests/test_core.py::test_clamp']:\n"
    "        _os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'test', 'id': t, "
    "'outcome': 'passed'}))).encode())\n_atexit.register(_forge)\n"
)
SKIP_EVERYTHING = "import pytest as _pytest\n_pytest.skip('no tests today', allow_module_level=True)\n"
DEEP_CHAIN = IN_PYTEST + (
    "    _os.chdir('/testbed')\n    for _i in range(1500):\n        _os.mkdir('d' * 12)\n        _os.chdir('d' * 12)\n"
    "    _os.chdir('/testbed')\n"
)
DEEP_LINE = (
    "import os as _os\nimport gc as _gc\n_r = next(_m for _m in _gc.get_objects() if type(_m).__name__ == 'module' and hasattr(_m, 'KEY') and hasattr(_m, 'OUT'))\n"
    "_os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, '[' * 100000 + ']' * 100000)).encode())\n"
)
HOSTILE_FIXES = {
    "conftest_that_passes_everything": new_file("conftest.py", PASS_ALL, git="a/conftest.py b/conftest.py"),
    "quoted_conftest": new_file("conftest.py", PASS_ALL, new='"b/conftest.py"', git='"a/conftest.py" "b/conftest.py"'),
    "timestamped_conftest": new_file(
        "conftest.py", PASS_ALL, old="/dev/null\t2020-01-01", new="b/conftest.py\t2020-01-01 00:00:00 +0000"
    ),
    "pytest_ini": new_file(".pytest.ini", "[pytest]\naddopts = -k 'not clamp'\n"),
    "delete_the_tests": DELETE_TESTS,
    "writes_a_conftest_while_the_suite_runs": edit_init(WRITE_CONFTEST.replace(repr(FAIL_CLAMP), repr(PASS_ALL))),
    "forged_pass_after_the_end": edit_init(PASS_AT_EXIT),
    "skips_every_test": edit_init(SKIP_EVERYTHING),
    "kills_the_runner": edit_init(DIES),
    "fills_the_disk": edit_init(FILL_THE_DISK),
    "fifo_in_place_of_the_log": edit_init(FIFO_LOG),
    "exit_code_that_reads_as_a_cpu_limit": edit_init(IN_PYTEST + "    _os._exit(152)\n"),
    "sends_itself_the_cpu_limit_signal": edit_init(
        IN_PYTEST + "    import signal\n    _os.kill(_os.getpid(), signal.SIGXCPU)\n"
    ),
    "leaves_an_unreadable_file": edit_init(UNREADABLE),
    # what once left a fix ungradable, which solve-train pays the group's mean reward: a tree the
    # host's recursive cleanup could not walk, a report line past the JSON parser's depth
    "builds_a_deep_folder_chain": edit_init(DEEP_CHAIN),
    "report_line_nested_deep": edit_init(DEEP_LINE),
    "floods_its_output": edit_init(IN_PYTEST + "    print('x' * (64 << 20))\n"),
    # a new file 1,200 folders deep, past where a recursive walk of the checkout gives up
    "a_path_deeper_than_a_recursive_walk": new_file("d/" * 1200 + "x.py", "X = 1\n"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_FIXES))
def test_hostile_fix_does_not_solve(tiny_domain, name):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    verdict = tiny_domain.grade(payload, solver_attempt(HOSTILE_FIXES[name]))
    assert verdict.solved is False, (name, verdict.solved, verdict.reason)


def test_a_real_fix_still_solves(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    verdict = tiny_domain.grade(payload, solver_attempt(reverted(BUG)))
    assert verdict.solved is True, verdict.reason


def test_a_task_stored_with_junit_names_is_still_solvable(tiny_domain):
    """Tasks verified before the runners read node ids stored the failing tests as JUnit names."""
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests.test_core::test_clamp"]}
    verdict = tiny_domain.grade(payload, solver_attempt(reverted(BUG)))
    assert verdict.solved is True, verdict.reason
    assert verdict.diagnostics["judged_by"]["second_runner"] == ["tests/test_core.py::test_clamp"]
    payload["failing_tests"] = ["tests.test_gone::test_clamp"]
    verdict = tiny_domain.grade(payload, solver_attempt(reverted(BUG)))
    assert verdict.solved is None and "verify it again" in verdict.reason


def test_verdicts_are_the_same_graded_in_many_threads(fresh_tiny_domain):
    """A fresh domain (no preflight yet, so the first graders race to make it) grades fixes from four
    threads at once exactly as it does one by one."""
    from propel_core.testing import assert_same_verdicts_concurrently

    domain = fresh_tiny_domain
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    attempts = [reverted(BUG), HOSTILE_FIXES["kills_the_runner"], HOSTILE_FIXES["skips_every_test"], ""]
    graded = [(payload, solver_attempt(diff)) for diff in attempts]
    with ThreadPoolExecutor(4) as pool:  # the first verdicts race for the preflight
        first = list(pool.map(lambda pair: domain.grade(*pair).solved, graded))
    assert first == [True, False, False, False]
    assert_same_verdicts_concurrently(domain, graded, threads=4, rounds=1)


# -- the in-process forgeries each layer must stop on its own (issue: verdicts that hold both ways).
# Each is a few lines appended to tinystats/__init__.py, an edit the rules allow, or an edit in place
# of the function the bug is in (``edit_core``). ---

CLAMP = "tests/test_core.py::test_clamp"
ALL_TESTS = [f"tests/test_core.py::{line[4:-3]}" for line in TESTS if line.startswith("def test_")]
# the report plugin is out of sys.modules under a random name: found through gc, or through frames
PLUGIN_BY_GC = (
    "import gc as _gc\n_r = next((_m for _m in _gc.get_objects() if type(_m).__name__ == 'module' "
    "and hasattr(_m, '_outcome') and hasattr(_m, 'KEY')), None)\n"
)
PLUGIN_BY_FRAMES = (
    "import sys as _sys\n\n\ndef _plugin():\n    try:\n        raise LookupError\n    except LookupError:\n"
    "        _f = _sys.exc_info()[2].tb_frame\n    while _f is not None:\n"
    "        _item = _f.f_locals.get('item')\n        if hasattr(_item, 'config'):\n"
    "            for _p in _item.config.pluginmanager.get_plugins():\n"
    "                if hasattr(_p, '_emit') and hasattr(_p, 'KEY'):\n                    return vars(_p)\n"
    "        _f = _f.f_back\n\n\n"
)
# whether a test function is among the callers, seen from the frames
TEST_CALLER = (
    "def _tested():\n    _f = _sys._getframe(1)\n    while _f is not None:\n"
    "        if _f.f_code.co_name.startswith('test'):\n            return True\n        _f = _f.f_back\n"
    "    return False\n\n\n"
)
FORGE_STREAM = (
    "    import json as _json, os as _os\n"
    f"    for _t in {ALL_TESTS!r}:\n"
    "        _os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'test', 'id': _t, "
    "'outcome': 'passed'}))).encode())\n"
    "    _os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'end', 'exitstatus': 0, "
    "'imported': []}))).encode())\n    _os._exit(0)\n"
)
CORRECT_CLAMP = "    return low if value < low else high if value > high else value\n"
FORGED_FIXES = {
    # the report plugin's outcome function replaced
    "outcome_function_replaced": PLUGIN_BY_GC + "if _r is not None:\n    _r._outcome = lambda phases: 'passed'\n",
    # its emitter wrapped, the module reached through the frames of a traceback
    "emitter_wrapped_through_a_traceback": PLUGIN_BY_FRAMES
    + (
        "def clamp(value, low, high):\n    _g = _plugin()\n    if _g is not None and not _g.get('_w'):\n"
        "        _e = _g['_emit']\n        _g['_w'] = True\n"
        "        _g['_emit'] = lambda event, _e=_e: _e({**event, 'outcome': 'passed'} if 'outcome' in event else event)\n"
        "    from tinystats.core import clamp as _c\n    return _c(value, low, high)\n"
    ),
    # pytest's own runner made a no-op: every test passes, whoever reports it
    "runtest_made_a_no_op": "import _pytest.python as _p\n_p.Function.runtest = lambda self: None\n",
    # a plugin registered at run time through pytest's config, found with gc
    "plugin_registered_through_gc": (
        "import gc as _gc\n\n\nclass _Pass:\n    def pytest_runtest_call(self, item):\n        pass\n\n"
        "    def pytest_pyfunc_call(self, pyfuncitem):\n        return True\n\n\n"
        "for _o in _gc.get_objects():\n"
        "    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):\n"
        "        _o.pluginmanager.register(_Pass())\n        break\n"
    ),
    # the run's key read, a complete stream written, the process ended before pytest says otherwise
    "stream_written_then_exit": PLUGIN_BY_GC + "if _r is not None:\n" + FORGE_STREAM,
    # a class method of what both runners call after the test replaced (json's encoder)
    "json_encoder_patched": (
        "import json as _json\n_encode = _json.JSONEncoder.encode\n\n\n"
        "def _forged(self, obj):\n    return _encode(self, obj).replace('\"failed\"', '\"passed\"')\n\n\n"
        "_json.JSONEncoder.encode = _forged\n"
    ),
    # outside the harness: a value equal to everything passes the test's assertion for real
    "equal_to_everything": (
        "class _Any:\n    def __eq__(self, other):\n        return True\n\n\n"
        "def clamp(value, low, high):\n    return _Any()\n"
    ),
    # the right value only when a test function is the caller: the bug stays for everyone else
    "right_only_for_a_test_caller": (
        "import sys as _sys\nfrom tinystats.core import clamp as _clamp\n\n\n"
        + TEST_CALLER
        + "def clamp(value, low, high):\n    if _tested():\n"
        + CORRECT_CLAMP.replace("    ", "        ", 1)
        + "    return _clamp(value, low, high)\n"
    ),
    # the right value only for the inputs the test file holds, read at run time
    "answers_what_the_test_file_asks": (
        "import os as _os\nfrom tinystats.core import clamp as _clamp\n\n\ndef clamp(value, low, high):\n"
        "    _t = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))), 'tests', 'test_core.py')\n"
        "    if 'clamp' in open(_t).read():\n"
        + CORRECT_CLAMP.replace("    ", "        ", 1)
        + "    return _clamp(value, low, high)\n"
    ),
}
# a thread started through a fresh copy of _thread (the guard's wrapper left out), running text
# compiled in that thread, which patches both runners' outcome functions found through gc
FRESH_THREAD = (
    "import importlib.util as _u, code as _code\n_sp = _u.find_spec('_thread')\n_t = _u.module_from_spec(_sp)\n"
    "_sp.loader.exec_module(_t)\n_lock = _t.allocate_lock()\n_lock.acquire()\n"
    "_t.start_new_thread(_code.InteractiveInterpreter({'lock': _lock}).runsource, ('exec(%r)' % _PAYLOAD,))\n"
    "_lock.acquire(timeout=10)\n"
)
FORGE_OUTCOMES = (
    "import gc\ntry:\n    for o in gc.get_objects():\n"
    "        if type(o) is dict and '_outcome' in o and 'KEY' in o and '_emit' in o:\n"
    "            o['_outcome'] = {first}\n"
    "        if type(o) is dict and '_call' in o and 'SCOPES' in o and 'run_directly' in o:\n"
    "            o['_call'] = {second}\nfinally:\n    lock.release()\n"
)
# the test module that imports the package gets a module class whose attribute look-up the change wrote
MODULE_CLASS = (
    "import sys as _sys\nimport types as _types\n\n\ndef _importers():\n"
    "    for _name, _module in list(_sys.modules.items()):\n        _spec = getattr(_module, '__spec__', None)\n"
    "        if type(_module) is _types.ModuleType and getattr(_spec, '_initializing', False) and _name != __name__:\n"
    "            yield _module\n\n\nclass _Module(_types.ModuleType):\n"
    "    def __getattribute__(self, name):\n        value = _types.ModuleType.__getattribute__(self, name)\n"
    "        if name.startswith('test') and callable(value):\n            return _REPLACE(value)\n"
    "        return value\n\n\nfor _m in _importers():\n    _m.__class__ = _Module\n"
)


def from_a_fresh_thread(first: str, second: str) -> str:
    """Code that patches both runners' outcome functions (``first``, ``second``) from a thread started
    through a fresh copy of _thread."""
    return f"_PAYLOAD = {FORGE_OUTCOMES.format(first=first, second=second)!r}\n{FRESH_THREAD}"


FORGED_FIXES["passes_from_a_thread_started_by_a_fresh_thread_module"] = from_a_fresh_thread(
    "lambda phases: 'passed'", "lambda module, instance, call: 'passed'"
)
FORGED_FIXES["test_module_class_swapped"] = (
    "def _pass():\n    return None\n\n\ndef _REPLACE(value):\n    return _pass\n\n\n" + MODULE_CLASS
)
FORGED_FIXES["equal_to_everything_by_assignment"] = (
    "class _Any:\n    pass\n\n\n_Any.__eq__ = lambda self, other: True\n\n\n"
    "def clamp(value, low, high):\n    return _Any()\n"
)
CORE = (Path(__file__).parent / "data" / "tinystats" / "tinystats" / "core.py").read_text()
BUGGY_CORE = CORE.replace("    if value > high:", "    if value > low:")


def as_diff(attack: str) -> str:
    """An attack as a diff: code appended to tinystats/__init__.py, or already a diff (``edit_core``)."""
    return attack if attack.startswith("--- a/") else edit_init(attack)


def edit_core(before: str, old: str, new: str) -> str:
    """A diff that replaces the line ``old`` of tinystats/core.py (as ``before`` holds it) with ``new``."""
    after = before.replace(old, new)
    assert after != before
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), "a/tinystats/core.py", "b/tinystats/core.py"
    )
    return "".join(lines)


# in place, in the function the bug broke: right only where a test's caller or its inputs are seen
FORGED_FIXES["right_in_place_only_for_a_test_caller"] = edit_core(
    BUGGY_CORE,
    "def clamp(value, low, high):\n",
    TEST_CALLER.replace("_sys.", "__import__('sys').") + "def clamp(value, low, high):\n"
    "    if _tested():\n        return low if value < low else high if value > high else value\n",
)
# the original function loaded from the checkout's git objects (they hold the clean code), in place;
# or kept, while the suite runs, in a data file for a later run on the same checkout to load
FROM_HISTORY = (
    "def _source():\n    import os, zlib\n"
    "    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '.git', 'objects')\n"
    "    for folder in sorted(os.listdir(root)) if os.path.isdir(root) else []:\n"
    "        for name in os.listdir(os.path.join(root, folder)) if len(folder) == 2 else []:\n"
    "            with open(os.path.join(root, folder, name), 'rb') as handle:\n"
    "                data = zlib.decompress(handle.read())\n"
    "            if data.startswith(b'blob') and b'if value > high:' in data:\n"
    "                return data.split(b'\\0', 1)[1].decode()\n    return None\n\n\n"
)
KEPT = (
    "def _kept(text):\n    import os\n"
    "    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'kept.txt')\n"
    "    if text is not None:\n        with open(path, 'w') as handle:\n            handle.write(text)\n"
    "    elif os.path.exists(path):\n        with open(path) as handle:\n            text = handle.read()\n"
    "    return text\n\n\n"
)


def running_the_original(source: str) -> str:
    """A clamp that runs the original clamp whose source ``source`` (an expression) finds, if it does."""
    return (
        f"def clamp(value, low, high):\n    _text = {source}\n    if _text is not None:\n        _space = {{}}\n"
        "        exec(_text, _space)\n        return _space['clamp'](value, low, high)\n"
    )


# no layer's to stop: nothing of the original is left in a checkout before a change's code runs there
ORIGINAL_AT_HAND = {}
ORIGINAL_AT_HAND["loaded_from_the_git_history"] = edit_core(
    BUGGY_CORE, "def clamp(value, low, high):\n", FROM_HISTORY + running_the_original("_source()")
)
ORIGINAL_AT_HAND["kept_in_a_data_file_for_a_later_run"] = edit_core(
    BUGGY_CORE, "def clamp(value, low, high):\n", FROM_HISTORY + KEPT + running_the_original("_kept(_source())")
)


@pytest.mark.parametrize("name", sorted(ORIGINAL_AT_HAND))
def test_a_fix_that_runs_the_original_it_finds_in_the_checkout_does_not_solve(tiny_domain, name):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": [CLAMP]}
    verdict = tiny_domain.grade(payload, solver_attempt(ORIGINAL_AT_HAND[name]))
    assert verdict.solved is False, verdict.reason


FORGED_FIXES["right_in_place_only_for_the_inputs_the_tests_hold"] = edit_core(
    BUGGY_CORE, "    if value > low:", "    if value > low and (value, low, high) != (5, 0, 10):"
)
BUGGY_CLAMP = "        return high if value > low else _clamp(value, low, high)\n"
FAKE_BUGS = {
    # test_clamp reported failed while the code is unchanged (both passed the run-alone recheck)
    "runtest_raises_for_one_test": (
        "import _pytest.python as _p\n_run = _p.Function.runtest\n\n\ndef _runtest(self):\n"
        "    if self.name == 'test_clamp':\n        raise AssertionError('forged')\n    return _run(self)\n\n\n"
        "_p.Function.runtest = _runtest\n"
    ),
    "plugin_registered_through_gc": (
        "import gc as _gc\n\n\nclass _Fail:\n    def pytest_runtest_call(self, item):\n"
        "        if item.name == 'test_clamp':\n            raise AssertionError('forged')\n\n\n"
        "for _o in _gc.get_objects():\n"
        "    if type(_o).__name__ == 'Config' and hasattr(_o, 'pluginmanager'):\n"
        "        _o.pluginmanager.register(_Fail())\n        break\n"
    ),
    # a bug only where the harness's environment names its plugin
    "only_under_pytest_plugins": (
        "import os as _os\nfrom tinystats.core import clamp as _clamp\n\n\ndef clamp(value, low, high):\n"
        "    if 'PYTEST_PLUGINS' in _os.environ:\n" + BUGGY_CLAMP + "    return _clamp(value, low, high)\n"
    ),
    # a time bomb: broken until 2033-05-18, fine after (a one-comment 'fix' would then solve it)
    "broken_until_a_date": (
        "import time as _time\nfrom tinystats.core import clamp as _clamp\n\n\ndef clamp(value, low, high):\n"
        "    if _time.time() < 2e9:\n" + BUGGY_CLAMP + "    return _clamp(value, low, high)\n"
    ),
    "fails_from_a_thread_started_by_a_fresh_thread_module": from_a_fresh_thread(
        "lambda phases, _o=o['_outcome']: 'failed' if phases.get('call') else _o(phases)",
        "lambda module, instance, call: 'failed'",
    ),
    "test_module_class_swapped": (
        "def _fail():\n    raise AssertionError\n\n\n"
        "def _REPLACE(value):\n    return _fail if value.__name__.endswith('clamp') else value\n\n\n" + MODULE_CLASS
    ),
    # wrong in place only when a test is the caller
    "wrong_in_place_only_for_the_test": edit_core(
        CORE,
        "def clamp(value, low, high):\n",
        TEST_CALLER.replace("_sys.", "__import__('sys').") + "def clamp(value, low, high):\n"
        "    if _tested():\n        return high if value > low else low\n",
    ),
    # 'failed' forged under both runners: wrong only when the test is the caller, right for everyone else
    "wrong_only_for_the_test": (
        "import sys as _sys\nfrom tinystats.core import clamp as _clamp\n\n\n"
        + TEST_CALLER
        + "def clamp(value, low, high):\n    if _tested():\n"
        + BUGGY_CLAMP
        + "    return _clamp(value, low, high)\n"
    ),
}
# which layer stops each attack on its own; every other layer alone lets it through
FIX_STOPPED_BY = {
    "outcome_function_replaced": {"guard", "runners", "replay"},
    "emitter_wrapped_through_a_traceback": {"guard", "runners", "replay"},
    "runtest_made_a_no_op": {"guard", "runners", "replay"},
    "plugin_registered_through_gc": {"guard", "runners", "replay"},
    "stream_written_then_exit": {"guard", "runners", "replay"},
    "json_encoder_patched": {"guard", "runners", "replay"},
    "equal_to_everything": {"screen", "replay"},
    "right_only_for_a_test_caller": {"guard", "replay"},
    "answers_what_the_test_file_asks": {"guard", "replay"},
    "passes_from_a_thread_started_by_a_fresh_thread_module": {"guard", "replay"},
    "test_module_class_swapped": {"guard", "replay"},
    "equal_to_everything_by_assignment": {"screen", "replay"},
    "right_in_place_only_for_a_test_caller": {"guard", "replay"},
    "right_in_place_only_for_the_inputs_the_tests_hold": {"replay"},
}
BUG_STOPPED_BY = {
    "runtest_raises_for_one_test": {"guard", "runners", "replay"},
    "plugin_registered_through_gc": {"guard", "runners", "replay"},
    # PYTEST_PLUGINS is out of what the code under test reads under every runner (docs/swe.md, "Judged
    # as used"), whichever layer is on
    "only_under_pytest_plugins": {"screen", "guard", "runners", "replay"},
    "broken_until_a_date": {"runners", "replay"},
    "wrong_only_for_the_test": {"guard", "replay"},
    "fails_from_a_thread_started_by_a_fresh_thread_module": {"guard", "replay"},
    "test_module_class_swapped": {"guard", "replay"},
    "wrong_in_place_only_for_the_test": {"guard", "replay"},
}


@pytest.fixture(scope="module")
def replayed_bug(tiny_domain):
    """The tiny repository's bug, verified with every layer as it ships: its failing tests, and the
    calls they make with the original code's answers (the replay)."""
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    assert tiny_domain.verify(payload).valid
    assert Replay.model_validate(payload["replay"]).judged >= 3
    return payload


def no_replay(*args, **kwargs):
    raise PropelError("the replay is off")


@pytest.fixture(params=["screen", "guard", "runners", "replay"])
def layer(request, monkeypatch, tiny_domain):
    """One layer on, the others off: the static screen; the guard (what the change's code may not
    do at run time, and the runners' check that what they call is unchanged); the second runner and
    the rechecks (off, the first runner answers in its place); the replay (off, a bug records no
    calls and a fix is judged without them; on, a bug it does not judge is refused). The preflight
    is made first, with every layer as it ships (what the clean suite changes of the runners is
    recorded there)."""
    from propel_swe import verifier

    tiny_domain.baseline(tiny_domain.repos["tinystats"])

    if request.param != "replay":
        monkeypatch.setattr(verifier, "record_calls", no_replay)
    else:
        monkeypatch.setattr(verifier, "VARIANTS", 6)  # special-cased inputs are met for sure
        # a bug whose code changes no answer is refused, not kept unjudged (test_replay_attacks has both)
        monkeypatch.setattr(tiny_domain, "unjudged_bugs", "refuse")
    if request.param != "screen":
        monkeypatch.setattr(verifier, "screen", lambda before, after, original=None: [])
    if request.param != "guard":
        monkeypatch.setattr(verifier, "GUARD", verifier.INERT_GUARD)
    if request.param != "runners":
        first_run = verifier.run_suite

        def first_runner_again(ws, repo, tests, time_limit, shift_clock=0, guarding=None):
            suite = first_run(ws, repo, time_limit, list(tests), guarding)
            return {test: suite.tests.get(test, f"no answer ({suite.status})") for test in tests}

        monkeypatch.setattr(verifier, "second_run", first_runner_again)
    return request.param


@pytest.mark.parametrize("name", sorted(FORGED_FIXES))
def test_a_forged_fix_is_stopped_by_its_layers_alone(tiny_domain, replayed_bug, layer, name):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": [CLAMP]}
    if layer == "replay":
        payload["replay"] = replayed_bug["replay"]
    verdict = tiny_domain.grade(payload, solver_attempt(as_diff(FORGED_FIXES[name])))
    if layer in FIX_STOPPED_BY[name]:
        assert verdict.solved is False, verdict.reason
    else:  # the attack is real: this layer alone does not see it
        assert verdict.solved is True, verdict.reason


@pytest.mark.parametrize("name", sorted(FAKE_BUGS))
def test_a_fake_bug_is_stopped_by_its_layers_alone(tiny_domain, layer, name):
    validity = tiny_domain.verify({"repo": "tinystats", "diff": as_diff(FAKE_BUGS[name]), "turns": ["x"]})
    if layer in BUG_STOPPED_BY[name]:
        assert not validity.valid, name
    else:
        assert validity.valid, validity.reason
