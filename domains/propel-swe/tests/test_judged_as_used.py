"""Judged as used (docs/swe.md, "Judged as used"): code under test reads the same of its process under
every judging runner as under a plain ``python -m pytest`` in the sandbox, so a change cannot behave
one way when judged and another when used. A probe in a copy of the tiny repository records what a
process shows of itself; the readings that the runners make a plain run's are compared; and the
issue's attack, a fix that is right only while a time limit's timer runs (and the fake bug that is
wrong only then), is graded as production grades it."""

import base64
import difflib
import json
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import DATA, SANDBOX, needs_local_sandbox
from swe_helpers import BUG, write_registry

from propel_core.plugins import Registry
from propel_swe import verifier
from propel_swe.checkout import git_checkout
from propel_swe.replay import Replay
from propel_swe.verifier import replay_answers, run_suite, second_run, workspace

#: repository code that writes what its process shows of itself to the file ``path``
PROBE = """\
import faulthandler
import gc
import json
import os
import resource
import signal
import sys
import threading
import warnings


def observe(path):
    import _imp
    import _signal
    import _thread

    descriptors = {}
    for fd in range(256):
        try:
            descriptors[fd] = oct(os.fstat(fd).st_mode >> 12)
        except OSError:
            pass
    with open(f"/proc/{os.getppid()}/comm") as comm:
        parent = comm.read().strip()
    asked = []
    sys.audit("propel.guard", "asks", (), {}, asked)  # the guard's own event: a plain process answers nothing
    reading = {
        "itimers": [signal.getitimer(which) for which in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)],
        "handlers": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals() if s < signal.SIGRTMIN},
        "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "rlimits": {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")},
        "environ": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv[1:],
        "guard answers": asked,
        "flags": list(sys.flags),
        "parent": parent,
        "threads": [thread.name for thread in threading.enumerate()],
        "gc": [gc.isenabled(), list(gc.get_threshold())],
        "recursion": [sys.getrecursionlimit(), sys.getswitchinterval()],
        "cwd": os.getcwd(),
        "path": sys.path,
        "importer cache": sorted(sys.path_importer_cache),
        "descriptors": descriptors,
        "modules": sorted(sys.modules),
        "meta_path": [type(finder).__name__ for finder in sys.meta_path],
        "faulthandler": faulthandler.is_enabled(),
        "warnings": len(warnings.filters),
        "main": getattr(sys.modules["__main__"], "__file__", None),
        "replaced": [type(f).__name__ for f in (_signal.signal, _thread.start_new_thread, _imp.create_builtin)],
    }
    with open(path, "w") as out:
        json.dump(reading, out)
"""
TEST = "import os\n\nfrom tinystats.probe import observe\n\n\ndef test_probe():\n    observe('reading.json')\n"
PROBE_TEST = "tests/test_probe.py::test_probe"
#: what the runners make a plain run's, for every runner; and, where the code runs in the checkout
#: itself (not the replayer's copy of it), its folder and import path
CLOSED = ("itimers", "handlers", "mask", "rlimits", "environ", "flags", "parent", "threads", "gc", "recursion",
          "guard answers")  # fmt: skip
IN_THE_CHECKOUT = ("cwd", "path")
#: the command line after the interpreter: a plain pytest run's under both runners; the replayer's is a
#: user's process started as ``python -`` (its program read from standard input), not pytest's
ARGUMENTS = ("argv", "orig_argv")
A_USERS = {"argv": ["-"], "orig_argv": ["-"]}
#: what pytest sets in its own process: the second runner calling a plain test, and the replayer, are
#: not pytest (a user's process is not either), and the replayer's checkout is a copy (its PWD)
NOT_PYTEST = {"PYTEST_VERSION", "PYTEST_CURRENT_TEST"}
ELSEWHERE = {"PWD"}


@pytest.fixture(scope="module")
def probed(test_env, tmp_path_factory):
    needs_local_sandbox()
    folder = tmp_path_factory.mktemp("probed")
    repo = Path(shutil.copytree(DATA / "tinystats", folder / "tinystats"))
    (repo / "tinystats" / "probe.py").write_text(PROBE)
    (repo / "tests" / "test_probe.py").write_text(TEST)
    git_checkout(repo)
    registry = write_registry(folder, [{"name": "tinystats", "path": str(repo), "time_budget": 120}])
    return Registry.build().domain(
        "swe",
        registry=str(registry),
        preflight_dir=str(folder / "preflight"),
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
    )


def read(ws, name: str) -> dict:
    reading = json.loads(ws.read(name))
    ws.run(f"rm -f {name}")
    return reading


def readings(domain) -> dict[str, dict]:
    """What the probe reads under a plain ``python -m pytest`` in the sandbox, and under each judging
    runner, each with a time limit running (the guard told of no change)."""
    repo = domain.repos["tinystats"]
    limits = {"time_limits": {PROBE_TEST: 30.0}, "written": {}}
    found = {}
    with workspace(domain.sandbox, repo) as ws:
        prelude, command = verifier.test_environment(repo)
        plain = ws.run(f"{prelude}\n{{ {command}\n}} >/dev/null 2>&1")  # the whole suite, as the first runner
        assert plain.returncode == 0, plain.stderr
        found["plain"] = read(ws, "reading.json")
        assert run_suite(ws, repo, 60, [PROBE_TEST], limits).tests == {PROBE_TEST: "passed"}
        found["first runner"] = read(ws, "reading.json")
        assert second_run(ws, repo, [PROBE_TEST], 60, guarding=limits) == {PROBE_TEST: "passed"}
        found["second runner"] = read(ws, "reading.json")
        assert second_run(ws, repo, [PROBE_TEST], 60, 400 * 86400, limits) == {PROBE_TEST: "passed"}
        found["second runner, clock moved"] = read(ws, "reading.json")
        layout = {"positional": ["path"], "varargs": None, "keyword": [], "varkw": None}
        call = pickle.dumps(("tinystats.probe", "observe", "function", layout, {"path": f"{repo.workdir}/r.json"}))
        # started with the string hash seed a verification draws (PYTHONHASHSEED), which the code must not read
        replay = Replay(calls=[base64.b64encode(call).decode()], paths=[], hash_seed=1 + verifier.HASH_SEEDS // 3)
        answered = replay_answers(ws, repo, replay, 60, {"written": {}})
        assert answered is not None and "returned" in answered["answers"][0][1], answered
        found["replayer"] = read(ws, "r.json")
    return found


def test_a_probe_reads_the_same_under_every_runner_as_under_a_plain_run(probed):
    found = readings(probed)
    plain = found["plain"]
    assert plain["itimers"] == [[0.0, 0.0]] * 3 and plain["threads"] == ["MainThread"]
    for runner, reading in found.items():
        unlike = (NOT_PYTEST if runner != "first runner" else set()) | (ELSEWHERE if runner == "replayer" else set())
        seen = [
            {**each, "environ": {k: v for k, v in each["environ"].items() if k not in unlike}}
            for each in (plain, reading)
        ]
        differ = {key: (seen[0][key], seen[1][key]) for key in CLOSED if seen[0][key] != seen[1][key]}
        assert not differ, (runner, differ)
    for runner in ("first runner", "second runner", "second runner, clock moved"):
        differ = {key: (plain[key], found[runner][key]) for key in IN_THE_CHECKOUT if found[runner][key] != plain[key]}
        assert not differ, (runner, differ)
        assert {key: found[runner][key] for key in ARGUMENTS} == {key: plain[key] for key in ARGUMENTS}, runner
    assert {key: found["replayer"][key] for key in ARGUMENTS} == A_USERS
    # the import system's cache holds no folder or file of propel's: the first runner's is a plain run's
    # and the others' (which import no pytest) hold nothing a plain run's does not
    assert found["first runner"]["importer cache"] == plain["importer cache"]
    for runner in ("second runner", "second runner, clock moved"):
        assert set(found[runner]["importer cache"]) <= set(plain["importer cache"]), runner


CORE = (DATA / "tinystats" / "tinystats" / "core.py").read_text()
BUGGY_CORE = CORE.replace("    if value > high:\n", "    if value > low:\n")
#: what a process under a time limit showed the code under test before the limit was kept from outside
JUDGED = {
    "timer": "signal.getitimer(signal.ITIMER_PROF)[0] > 0",
    "handler": "signal.getsignal(signal.SIGPROF) not in (signal.SIG_DFL, None)",
}


def core_diff(before: str, old: str, new: str, helper: str = "") -> str:
    """tinystats/core.py's line ``old`` made ``new``, ``import signal`` and ``helper`` put first: a diff
    from ``before``."""
    after = "import signal\n\n" + helper + before.replace(old, new)
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), "a/tinystats/core.py", "b/tinystats/core.py"
    )
    return "".join(lines)


@pytest.fixture(scope="module")
def replayed_bug(tiny_domain):
    """The tiny repository's bug, verified as it ships: the calls its failing tests make, replayed."""
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    assert tiny_domain.verify(payload).valid
    return payload


@pytest.mark.parametrize("sign", sorted(JUDGED))
def test_a_fix_right_only_while_judged_does_not_solve(tiny_domain, replayed_bug, sign):
    """The issue's attack: a fix that keeps the bug unless a time limit's timer (or its handler) is
    in the process; every runner and the replayer once had one, so it was solved in every run."""
    fix = core_diff(BUGGY_CORE, "    if value > low:\n", f"    if value > (high if {JUDGED[sign]} else low):\n")
    payload = {**replayed_bug, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    attempt = json.dumps({"diff": fix, "stop_reason": "stop", "status": "finished", "turns": []})
    verdict = tiny_domain.grade(payload, attempt)
    assert verdict.solved is False and "baseline-passing tests do not pass" in verdict.reason, verdict.reason


@pytest.mark.parametrize("sign", sorted(JUDGED))
def test_a_bug_wrong_only_while_judged_is_not_valid(tiny_domain, sign):
    """The mirror: a fake bug, wrong only while a time limit's timer (or handler) is in the process."""
    bug = core_diff(CORE, "    if value > high:\n", f"    if value > (low if {JUDGED[sign]} else high):\n")
    validity = tiny_domain.verify({"repo": "tinystats", "diff": bug, "turns": ["x"]})
    assert validity.valid is False and "no previously passing test fails" in validity.reason, validity.reason


#: what a fix's own code read to tell a judging process from a user's, before each was closed (issue
#: 58's attacker), and what stops it now: the guard's hook answering whoever raised its event (now
#: nobody but its own functions: the fix keeps the bug under both runners), pytest's ``__main__`` in
#: the replayer's ``sys.argv`` (now a user's ``python -``: the replay sees the bug), a test file read
#: through a hard link (the guard refused it by name only; now by the file's identity too)
SIGNS = {
    "the guard answers": (
        "    box = []\n    sys.audit('pro' + 'pel.guard', 'asks', (), {}, box)\n    return bool(box)\n",
        "baseline-passing tests do not pass",
    ),
    "pytest's arguments": ("    return sys.argv[0].endswith('__main__.py')\n", "answer otherwise outside the tests"),
    "a test file by a second name": (
        "    here = os.path.dirname(os.path.abspath(__file__))\n"
        "    if not os.path.exists(os.path.join(here, 'notes.txt')):\n"
        "        os.link(os.path.join(here, '..', 'tests', 'test_core.py'), os.path.join(here, 'notes.txt'))\n"
        "    try:\n"
        "        with open(os.path.join(here, 'notes.txt')) as notes:\n"
        "            return 'def test_clamp' in notes.read()\n"
        "    except OSError:\n"
        "        return False\n",
        "the fix asked to open the tests' files",
    ),
}


@pytest.mark.parametrize("sign", sorted(SIGNS))
def test_a_fix_right_only_where_it_reads_a_sign_of_being_judged_does_not_solve(tiny_domain, replayed_bug, sign):
    """Before, each of these fixes was solved in every run, with 16 replayed calls."""
    body, stopped = SIGNS[sign]
    helper = f"import os\nimport sys\n\n\ndef judged():\n{body}\n\n"
    fix = core_diff(BUGGY_CORE, "    if value > low:\n", "    if value > (high if judged() else low):\n", helper)
    payload = {**replayed_bug, "turns": [], "failing_tests": ["tests/test_core.py::test_clamp"]}
    attempt = json.dumps({"diff": fix, "stop_reason": "stop", "status": "finished", "turns": []})
    verdict = tiny_domain.grade(payload, attempt)
    assert verdict.solved is False and stopped in verdict.reason, verdict.reason
