"""Hostile diffs against the SWE verifier and grader, on the tiny repository in the real sandbox.

Under RL the bug writer is paid for whatever ``verify`` accepts and the solver for whatever ``grade``
accepts, so each diff here tries to be accepted without being a bug (or a fix): by naming paths in
ways git reads differently from a header parser, by hijacking the runner or its configuration, by
tampering with files while the suite runs, or by forging the report. Each must be refused.
"""

import json
import signal
from pathlib import Path

import pytest
from swe_helpers import BUG

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
}

# Diffs of allowed files whose code, once imported by the suite, tampers with the verdict.
WRITE_CONFTEST = (
    "import os as _os\n_here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))\n"
    f"open(_os.path.join(_here, 'tests', 'conftest.py'), 'w').write({FAIL_CLAMP!r})\n"
)
FD3_FORGERY = 'import os as _os\n_os.write(3, b\'PROPEL-REPORT 0000 {"event": "end"}\\n\')\n'
STOLEN_KEY = (
    "import json as _json, os as _os, sys as _sys\n_r = _sys.modules['propel_report']\n"
    "_os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'test', "
    "'id': 'tests/test_core.py::test_clamp', 'outcome': 'failed'}))).encode())\n"
)
AFTER_THE_END = (
    "import atexit as _atexit, json as _json, os as _os, sys as _sys\n_r = _sys.modules['propel_report']\n"
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
    "    _d = [p for p in _os.environ['PYTHONPATH'].split(':') if 'run-' in p][0]\n"
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


@pytest.fixture(autouse=True)
def deadline():
    """A verdict that hangs (a FIFO the harness would block on) fails the test instead of the run."""

    def expired(*_):
        raise TimeoutError("the verdict did not come within 240 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("name", sorted(PATH_BUGS) + sorted(RUN_BUGS))
def test_hostile_bug_is_refused(tiny_domain, name):
    diff, reason = {**PATH_BUGS, **RUN_BUGS}[name]
    payload = {"repo": "tinystats", "diff": diff, "turns": ["x"]}
    validity = tiny_domain.verify(payload)
    assert not validity.valid, f"{name} was accepted as a bug"
    assert reason in validity.reason, validity.reason


def solver_attempt(diff: str) -> str:
    return json.dumps({"diff": diff, "stop_reason": "stop", "status": "finished", "turns": []})


PASS_AT_EXIT = (
    "import atexit as _atexit, json as _json, os as _os, sys as _sys\n_r = _sys.modules.get('propel_report')\n"
    "def _forge():\n    for t in ['tests/test_core.py::test_clamp']:\n"
    "        _os.write(_r.OUT, ('PROPEL-REPORT %s %s\\n' % (_r.KEY, _json.dumps({'event': 'test', 'id': t, "
    "'outcome': 'passed'}))).encode())\n_atexit.register(_forge)\n"
)
SKIP_EVERYTHING = "import pytest as _pytest\n_pytest.skip('no tests today', allow_module_level=True)\n"
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
}


@pytest.mark.parametrize("name", sorted(HOSTILE_FIXES))
def test_hostile_fix_does_not_solve(tiny_domain, name):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    verdict = tiny_domain.grade(payload, solver_attempt(HOSTILE_FIXES[name]))
    assert verdict.solved is False, (name, verdict.solved, verdict.reason)


def test_a_real_fix_still_solves(tiny_domain):
    fix = BUG.replace("a/", "x/").replace("b/", "a/").replace("x/", "b/")
    fix = fix.replace("-    if value > high:", "=").replace("+    if value > low:", "-    if value > low:")
    fix = fix.replace("=", "+    if value > high:")
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    verdict = tiny_domain.grade(payload, solver_attempt(fix))
    assert verdict.solved is True, verdict.reason
