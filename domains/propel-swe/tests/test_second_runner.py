"""The second runner judges each way a test can be written as pytest does, in the real sandbox: the
tests of a repository written for this (xunit set-ups with and without arguments, a plain
``setup_class``, ``unittest`` class fixtures, ``setUpModule``, an autouse fixture, parameters) fail
with a bug and pass with its fix, under the second runner as under pytest; and it runs them in the
environment the repository's registry entry gives its tests."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import DATA, SANDBOX, local_domain, needs_local_sandbox
from swe_helpers import BUG as TINY_BUG
from swe_helpers import fenced, reverted, scripted, write_registry

from propel_core.plugins import Registry
from propel_swe.checkout import git_checkout
from propel_swe.verifier import apply_diffs, run_suite, second_run, workspace

BUG = "--- a/styles/core.py\n+++ b/styles/core.py\n@@ -1,2 +1,2 @@\n def double(x):\n-    return x * 2\n+    return x * 3\n"
FIX = BUG.replace("-    return x * 2\n+    return x * 3", "-    return x * 3\n+    return x * 2")
TESTS = [
    "tests/test_camel_module.py::test_doubles",
    "tests/test_fixtures.py::test_doubles_each[1-2]",
    "tests/test_fixtures.py::test_doubles_what_the_fixture_set",
    "tests/test_xunit.py::TestClassSetUpWithoutClassmethod::test_doubles",
    "tests/test_xunit.py::TestRaises::test_doubles_and_refuses_nothing",
    "tests/test_xunit.py::TestUnittestClassSetUp::test_doubles",
    "tests/test_xunit.py::test_module_and_function_set_up",
]


def test_each_style_fails_with_the_bug_and_passes_with_the_fix(styles_domain):
    repo = styles_domain.repos["teststyles"]
    baseline = styles_domain.baseline(repo)
    assert {test: baseline.tests[test] for test in TESTS} == dict.fromkeys(TESTS, "passed")
    with workspace(styles_domain.sandbox, repo) as ws:
        assert apply_diffs(ws, [BUG]) is None
        alone = {test: second_run(ws, repo, [test], 60, shift_clock=400 * 86400)[test] for test in TESTS}
        assert alone == dict.fromkeys(TESTS, "failed")
        assert apply_diffs(ws, [FIX]) is None
        assert second_run(ws, repo, TESTS, 60) == dict.fromkeys(TESTS, "passed")  # all in one process


#: a bug that makes double() loop for ever, and the diff that undoes it
LOOP = "    while x == x:\n        x = -x\n    return x * 2\n"
HANG = "--- a/styles/core.py\n+++ b/styles/core.py\n@@ -1,2 +1,4 @@\n def double(x):\n-    return x * 2\n" + "".join(
    f"+{line}\n" for line in LOOP.splitlines()
)
UNHANG = (
    "--- a/styles/core.py\n+++ b/styles/core.py\n@@ -1,4 +1,2 @@\n def double(x):\n"
    + "".join(f"-{line}\n" for line in LOOP.splitlines())
    + "+    return x * 2\n"
)


#: what HANG makes of each style's test: the tests that call double() in a set-up are errors
HUNG = {test: "error" if "camel" in test or "SetUp" in test else "failed" for test in TESTS}


def test_a_test_past_its_time_limit_fails_in_each_style_under_both_runners(styles_domain):
    """A call stopped at its time limit is a failed test, and a set-up stopped there an error,
    whichever way the test is written and whichever runner runs it; the run goes on to the next test."""
    repo = styles_domain.repos["teststyles"]
    limits = {"time_limits": dict.fromkeys(styles_domain.baseline(repo).tests, 0.5)}
    with workspace(styles_domain.sandbox, repo) as ws:
        assert apply_diffs(ws, [HANG]) is None
        assert second_run(ws, repo, TESTS, 60, guarding=limits) == HUNG
        suite = run_suite(ws, repo, 60, guarding=limits)
        assert suite.status == "ok" and {test: suite.tests[test] for test in TESTS} == HUNG
        assert all(0.5 <= suite.durations[test] < 5 for test in TESTS), suite.durations


def test_a_bug_that_hangs_tests_is_judged_on_them(styles_domain, monkeypatch):
    """Tests a bug makes loop for ever fail at their time limit (from the preflight's durations),
    alone, under the second runner and with the clock moved too, so the bug is valid and its revert
    solves it; without the limits the whole suite would run out of its budget."""
    from propel_swe import verifier

    monkeypatch.setattr(verifier, "MIN_TEST_SECONDS", 0.5)
    baseline = styles_domain.baseline(styles_domain.repos["teststyles"])
    assert set(TESTS) <= set(baseline.durations) and all(0 < seconds < 5 for seconds in baseline.durations.values())
    payload = {"repo": "teststyles", "diff": HANG, "turns": ["x"]}
    validity = styles_domain.verify(payload)
    assert validity.valid, validity.reason
    failed = {test for test, outcome in HUNG.items() if outcome == "failed"}
    assert set(payload["failing_tests"]) == failed | {"tests/test_fixtures.py::test_doubles_each[0-0]"}
    attempt = {"diff": UNHANG, "stop_reason": "stop", "status": "finished", "turns": []}
    verdict = styles_domain.grade(payload, json.dumps(attempt))
    assert verdict.solved is True, verdict.reason


def test_a_real_bug_and_its_fix_in_these_styles(styles_domain):
    payload = {"repo": "teststyles", "diff": BUG, "turns": ["x"]}
    validity = styles_domain.verify(payload)
    assert validity.valid, validity.reason
    assert set(payload["failing_tests"]) == set(TESTS)
    attempt = {"diff": FIX, "stop_reason": "stop", "status": "finished", "turns": []}
    verdict = styles_domain.grade(payload, json.dumps(attempt))
    assert verdict.solved is True, verdict.reason


MODE_TEST = (
    "import os\n\nfrom tinystats import clamp\n\n\ndef test_clamp_in_strict_mode():\n"
    "    assert os.environ['TINY_MODE'] == 'strict'\n    assert clamp(3, 0, 10) == 3\n"
)


@pytest.mark.parametrize(
    "spec",
    [
        {"test_command": "TINY_MODE=strict python -m pytest -q -p no:cacheprovider"},
        {"env": {"TINY_MODE": "strict"}},
    ],
)
def test_both_runners_run_the_tests_in_the_repositorys_environment(spec, test_env, tmp_path):
    """A test that needs a variable the registry sets (in the test command, or as env) passes on the
    clean checkout and fails with the bug under both runners, and the bug's revert solves it."""
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path / "tinystats"))
    (repo / "tests" / "test_mode.py").write_text(MODE_TEST)
    git_checkout(repo)
    needs_local_sandbox()
    registry = write_registry(tmp_path, [{"name": "tinystats", "path": str(repo), "time_budget": 120, **spec}])
    domain = Registry.build().domain(
        "swe",
        registry=str(registry),
        preflight_dir=str(tmp_path / "preflight"),
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
    )
    baseline = domain.baseline(domain.repos["tinystats"])
    assert baseline.tests["tests/test_mode.py::test_clamp_in_strict_mode"] == "passed"
    payload = {"repo": "tinystats", "diff": TINY_BUG, "turns": ["x"]}
    validity = domain.verify(payload)
    assert validity.valid, validity.reason
    assert "tests/test_mode.py::test_clamp_in_strict_mode" in payload["failing_tests"][:3]
    verdict = domain.grade(payload, json.dumps({"diff": reverted(TINY_BUG), "status": "finished", "turns": []}))
    assert verdict.solved is True, verdict.reason


def test_a_failing_test_the_solver_never_sees_still_judges_its_fix(test_env, tmp_path):
    """With two failing tests, one is hidden (``hidden_failing_tests``, 0.5): not named in the
    solver's prompt, gone from its workspace, and run all the same when its fix is graded."""
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path / "tinystats"))
    (repo / "tests" / "test_mode.py").write_text(MODE_TEST)
    git_checkout(repo)
    needs_local_sandbox()
    spec = {"name": "tinystats", "path": str(repo), "time_budget": 120, "env": {"TINY_MODE": "strict"}}
    domain = Registry.build().domain(
        "swe",
        registry=str(write_registry(tmp_path, [spec])),
        preflight_dir=str(tmp_path / "preflight"),
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
    )
    payload = {"repo": "tinystats", "diff": TINY_BUG, "turns": ["x"]}
    assert domain.verify(payload).valid
    hidden = "tests/test_mode.py::test_clamp_in_strict_mode"
    assert payload["failing_tests"] == ["tests/test_core.py::test_clamp", hidden]
    assert domain.hidden_tests(payload) == [hidden]
    assert hidden not in domain.solver_prompt(payload)[-1]["content"]
    reply = scripted(fenced("bash", "cat tests/test_mode.py; git status --short"), fenced("submit"))
    attempt = json.loads(domain.solver_episode(payload, reply))
    shown = reply.seen[1][-1]["content"]
    assert "import os" in shown and "strict_mode" not in shown and attempt["diff"] == ""  # and no trace in git
    fix = json.dumps({"diff": reverted(TINY_BUG), "status": "finished", "turns": []})
    verdict = domain.grade(payload, fix)
    assert verdict.solved is True and verdict.diagnostics["judged_by"]["hidden_from_the_solver"] == [hidden]
    # a "fix" that special-cases the test it was shown fails the one it never saw
    special = reverted(TINY_BUG).replace("+    if value > high:", "+    if value > low and value != 5:")
    verdict = domain.grade(payload, json.dumps({"diff": special, "status": "finished", "turns": []}))
    assert verdict.solved is False, verdict.reason


@pytest.mark.parametrize(
    "outcome, line",
    [
        ("failed", "    pytest.fail('clamped')"),  # as pytest.raises' "DID NOT RAISE" fails a test
        ("skipped", "    pytest.skip('not here')"),
        ("skipped", "    pytest.xfail('known')"),
        ("failed", "    raise SystemExit(3)"),
    ],
)
def test_pytests_own_outcomes_in_a_plain_test_are_judged_as_pytest_judges_them(test_env, tmp_path, outcome, line):
    """pytest's outcomes are no Exception (``pytest.raises`` failing with "DID NOT RAISE" is one): the
    second runner called a plain test that ended in one an error, so a real bug whose test fails that
    way was refused ("the runners disagree"). The test here is a plain one, which it calls itself."""
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path / "tinystats"))
    (repo / "tests" / "test_outcome.py").write_text(f"import pytest\n\n\ndef test_outcome():\n{line}\n")
    domain = local_domain("tinystats", git_checkout(repo), test_env, tmp_path)
    repo_spec, test = domain.repos["tinystats"], "tests/test_outcome.py::test_outcome"
    with workspace(domain.sandbox, repo_spec) as ws:
        assert run_suite(ws, repo_spec, 60, [test]).tests[test] == outcome  # pytest's own word
        assert second_run(ws, repo_spec, [test], 60) == {test: outcome}


def test_a_bug_whose_test_fails_by_did_not_raise_is_valid_and_its_revert_solves(tiny_domain):
    bug = (
        "--- a/tinystats/core.py\n+++ b/tinystats/core.py\n@@ -1,5 +1,5 @@\n def mean(values):\n"
        '     if not values:\n-        raise ValueError("mean of no values")\n+        return 0.0\n'
        "     return sum(values) / len(values)\n \n \n"
    )
    payload = {"repo": "tinystats", "diff": bug, "turns": ["x"]}
    validity = tiny_domain.verify(payload)
    assert validity.valid, validity.reason
    assert payload["failing_tests"] == ["tests/test_core.py::test_mean_of_nothing"]
    fix = (
        bug.replace("-        raise", "=")
        .replace("+        return 0.0", "-        return 0.0")
        .replace("=", "+        raise")
    )
    solved = tiny_domain.grade(
        payload, json.dumps({"diff": fix, "stop_reason": "stop", "status": "finished", "turns": []})
    )
    assert solved.solved is True, solved.reason
