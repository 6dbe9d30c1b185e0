"""Running a repository's test suite, its baseline (preflight), and the two verdicts built on it:
is a diff a real bug (the validity predicate), and does a fix solve it (the solver's grade).

Every check starts from a fresh, clean checkout in a fresh sandbox, so nothing an agent did to its
own workspace (its git metadata included) can reach a verdict. What a diff changed is read from
snapshots of the checkout before and after (``diffs``), and test outcomes from our pytest plugin's
lines on a pipe (``pytest_report``), never from a file or output the code under test can rewrite.
``docs/sandbox.md`` says what this guarantees and what it cannot.
"""

from __future__ import annotations

import glob
import json
import secrets
import shlex
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from propel_core import PropelError
from propel_plugins.sandbox import OUT_DIR
from propel_swe.diffs import change_problems, is_test_path, run_problems
from propel_swe.guard import written_lines
from propel_swe.replay import (
    CALL_SECONDS,
    RECORDER,
    REPLAYER,
    TIMEOUT,
    VARIANTS,
    Replay,
    answers_of,
    differing,
    in_order,
    of_the_original,
    recording_orders,
    told,
)
from propel_swe.report import OUTCOMES, PLUGIN, SNAPSHOT, read_report
from propel_swe.repos import RepoSpec
from propel_swe.screen import screen

MAX_BASELINE_FAILURES = 1  # paper 13.1
RECHECKS = 3  # failing tests of a bug run again, each alone in a fresh process on a fresh checkout
MIN_SUITE_SECONDS, SUITE_BUDGET_FACTOR = 30.0, 10.0  # a verification's budget from the preflight's duration
MIN_TEST_SECONDS, TEST_TIME_FACTOR = 5.0, 20.0  # a test's time limit from its own duration (``time_limits``)
SECOND_RUNNER = (Path(__file__).parent / "second_runner.py").read_bytes()
GUARD = (Path(__file__).parent / "guard.py").read_bytes()
#: the guard switched off, to measure what the other layers stop alone (test_hostile, swe_timings.py):
#: it installs nothing, refuses nothing and sees nothing changed; the rest of it is kept
INERT_GUARD = (
    GUARD.decode().split("\ndef install(")[0]
    + "\ndef install(root, written):\n    return (lambda: ()), (lambda: False)\n\n\n"
    + "def as_a_user("
    + GUARD.decode().split("\ndef as_a_user(")[1].split("\ndef watch(")[0]
    + "\ndef watch(prefixes):\n    return lambda: []\n"
).encode()
WATCHER = (Path(__file__).parent / "watcher.py").read_bytes()
#: run as ``python -I -S`` in the checkout: removes the git history and everything in the harness's folder argv[1]
SEAL = """
import os, shutil, sys
for path in [".git"] + [os.path.join(sys.argv[1], name) for name in os.listdir(sys.argv[1])]:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
"""
#: a src layout (code under src/, no package there) is importable as an installed package would be
SRC_LAYOUT = (
    'if [ -d src ] && [ ! -e src/__init__.py ]; then export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src"; fi'
)
# how far libfaketime moves the clock when a bug's failing tests run again, in two runs: to the end of
# this range (less a random part of a day), so a bug that only lasts until a date in it is seen, and to
# a time drawn afresh in it, so a bug that comes back periodically (years ending in 6) has no fixed
# shift to aim at
CLOCK_SHIFT_DAYS = (400, 3650)
#: the string hash seeds a replay is drawn from (``PYTHONHASHSEED``: 1 to 2**32 - 1; 0 would turn hashing's
#: randomization off, which ``sys.flags`` shows and a plain run does not)
HASH_SEEDS = 2**32 - 1


class SuiteRun(BaseModel):
    status: str = Field(description="ok: the suite ran and reported; else tampered, no_report, timeout, ...")
    tests: dict[str, str] = Field(default_factory=dict, description="pytest node id -> outcome")
    durations: dict[str, float] = Field(default_factory=dict, description="pytest node id -> seconds")
    imported: list[str] = Field(default_factory=list)
    machinery: list[str] = Field(default_factory=list, description="runner functions the run changed")
    refused: list[str] = Field(default_factory=list, description="what the guard refused the change")
    lines_run: dict[str, list[int]] | None = Field(None, description="path -> lines that ran (a traced run)")
    duration: float = 0.0
    detail: str | None = None


class Baseline(BaseModel):
    """Preflight: the suite once on the unmodified checkout (paper 13.1)."""

    repo: str
    key: str
    status: str
    tests: dict[str, str] = Field(default_factory=dict)
    durations: dict[str, float] = Field(
        default_factory=dict, description="pytest node id -> seconds it took (what its time limit is made from)"
    )
    test_count: int = 0
    failures: int = 0
    duration: float = 0.0
    imported_files: list[str] = Field(
        default_factory=list, description="non-test files of the checkout the suite imported (repo-relative)"
    )
    lines_run: dict[str, list[int]] | None = Field(
        None,
        description="imported file -> the lines of it the suite ran (where the procedural generator plants "
        "bugs); None in a preflight that did not trace",
    )
    machinery_changes: list[str] = Field(
        default_factory=list, description="functions and classes of the runners that the clean suite changes"
    )
    detail: str | None = None

    @property
    def reasons(self) -> list[str]:
        """Why the repository is dropped; empty when it is kept."""
        reasons = []
        if self.status != "ok":
            reasons.append(f"status {self.status}" + (f": {self.detail}" if self.detail else ""))
        if self.test_count == 0:
            reasons.append("no tests")
        elif "passed" not in self.tests.values():  # a collection error is reported as a failing "test"
            outcomes = ", ".join(f"{count} {outcome}" for outcome, count in Counter(self.tests.values()).items())
            failing = f": {named(self.failing)}" if self.failing else ""
            reasons.append(f"the suite ran nothing: no test passed ({outcomes}{failing})")
        elif self.failures > MAX_BASELINE_FAILURES:
            reasons.append(
                f"{self.failures} baseline failures (at most {MAX_BASELINE_FAILURES}): {named(self.failing)}"
            )
        return reasons

    @property
    def failing(self) -> list[str]:
        """The tests that failed or errored on the clean checkout (a file that could not be collected
        among them, by its path), in the suite's order."""
        return [test for test, outcome in self.tests.items() if outcome in ("failed", "error")]

    @property
    def keep(self) -> bool:
        return not self.reasons


def named(tests: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``tests`` and how many more: ``a, b, c and 4 more``."""
    more = f" and {len(tests) - shown} more" if len(tests) > shown else ""
    return ", ".join(tests[:shown]) + more


def workspace(sandbox, repo: RepoSpec):
    return sandbox.workspace(path=repo.path, image=repo.image, workdir=repo.workdir)


def suite_budget(repo: RepoSpec, baseline: Baseline) -> float:
    """Seconds one verification run of the suite may take: ten times the preflight's duration, at
    least 30 s, at most the repository's ``time_budget`` (which bounds the preflight itself)."""
    return min(repo.time_budget, max(MIN_SUITE_SECONDS, SUITE_BUDGET_FACTOR * baseline.duration))


def own_seconds(result) -> float:
    """How long a run took as its sandbox judged its time (the local sandbox's own time: CPU time plus
    idle time, ``propel_core.clock``), so a preflight on a busy machine gives the same budgets as on an
    idle one; the wall clock where no clock judged it (the docker sandbox)."""
    own = getattr(result, "own_seconds", None)
    return result.duration if own is None else own


def test_environment(repo: RepoSpec, where: str | None = None) -> tuple[str, str]:
    """(shell lines that enter the checkout, or the folder ``where`` (shell text) holding a copy of
    it, and set the tests' environment as the registry gives it, a src layout on ``PYTHONPATH``; the
    test command without its leading assignments): where both runners and the replayer start."""
    lines, command = repo.test_environment()
    return "\n".join([f"cd {where or shlex.quote(repo.workdir)}", *lines, SRC_LAYOUT]), command


def run_suite(
    ws,
    repo: RepoSpec,
    time_limit: float,
    select: list[str] | None = None,
    guarding: dict[str, Any] | None = None,
) -> SuiteRun:
    """Run the test command in its environment with our report plugin (``pytest_report``) and the
    guard beside it, under module and folder names the code under test cannot know in advance; the
    outcome of each test from the plugin's lines on descriptor 3, through the watcher (``watcher``,
    which keeps each test's time limit from outside the process), the suite's own output to a log
    file. ``select``: only these node ids; ``guarding``: what the guard is told (``guard_orders``)."""
    folder, key = f"{OUT_DIR}/run-{secrets.token_hex(8)}", secrets.token_hex(16)
    plugin, guard, watcher = f"p{secrets.token_hex(6)}", f"g{secrets.token_hex(6)}", f"w{secrets.token_hex(6)}"
    made = ws.run(f"mkdir -m 755 {folder}")
    if made.returncode != 0:
        return SuiteRun(status="sandbox_error", detail=f"could not prepare the run: {made.stderr.strip()[-200:]}")
    ws.write(f"{folder}/{plugin}.py", PLUGIN)
    ws.write(f"{folder}/{guard}.py", GUARD)
    ws.write(f"{folder}/{watcher}.py", WATCHER)
    orders = {"key": key, "root": repo.workdir, "select": select, "guard": guard, **(guarding or {})}
    ws.write(f"{folder}/orders.json", json.dumps(orders).encode())
    prelude, test_command = test_environment(repo)
    command = (
        f"{prelude}\nexport PYTHONPATH={folder}${{PYTHONPATH:+:$PYTHONPATH}} "
        f"PYTEST_PLUGINS={plugin}${{PYTEST_PLUGINS:+,$PYTEST_PLUGINS}}\n"
        f"{{ {test_command}\n}} 3>&1 >{folder}/suite.log 2>&1 | python -I -S {folder}/{watcher}.py {key}"
    )
    result = ws.run(command, time_limit=time_limit)
    if result.status not in ("ok", "error"):
        return SuiteRun(status=result.status, duration=own_seconds(result), detail=result.detail)
    report = read_report(result.stdout, key)
    if report.problem:
        try:
            tail = " | ".join(ws.read(f"{folder}/suite.log").decode(errors="replace").strip().splitlines()[-3:])
        except (OSError, PropelError):
            tail = ""
        status = "no_report" if "no end" in report.problem or "without" in report.problem else "tampered"
        return SuiteRun(status=status, duration=own_seconds(result), detail=f"{report.problem}; output ends: {tail}")
    return SuiteRun(
        status="ok",
        tests=report.tests,
        durations=report.durations,
        imported=report.imported,
        machinery=report.machinery,
        refused=report.refused,
        lines_run=report.lines_run,
        duration=own_seconds(result),
    )


def snapshot(ws) -> dict[str, str]:
    """Every file of the checkout but ``.git`` (mode and content hash, or a link's target), listed by
    a fresh ``python -I -S`` that runs none of the repository's code."""
    out = f"{OUT_DIR}/snapshot-{secrets.token_hex(8)}.json"
    taken = ws.run(f"python -I -S -c {shlex.quote(SNAPSHOT)} {out}")
    if taken.returncode != 0:
        raise PropelError(f"could not list the checkout ({taken.status}): {taken.stderr.strip()[-300:]}")
    return json.loads(ws.read(out, limit=256 << 20))


def checked_run(
    ws,
    repo: RepoSpec,
    time_limit: float,
    before: dict[str, str],
    select: list[str] | None = None,
    guarding: dict[str, Any] | None = None,
):
    """``run_suite``, then what the run left changed since snapshot ``before`` that it may not
    (``diffs.run_problems``; a checkout the snapshot cannot list is a problem too)."""
    suite = run_suite(ws, repo, time_limit, select, guarding)
    if suite.status != "ok":
        return suite, []
    try:
        return suite, run_problems(before, snapshot(ws))
    except PropelError as exc:
        return suite, [f"the checkout cannot be listed after the run: {exc}"]


def preflight(sandbox, repo: RepoSpec) -> Baseline:
    """Run the suite once on the clean checkout: status, test count, duration, failures, per-test,
    and which of its files the suite imports; then, where it ran, once more traced, for the lines of
    those files it runs (``lines_run``; None where the traced run did not report). Tracing slows the
    code under test several times over, so the outcomes and durations are the plain run's alone."""
    guarding = {"time_limit": repo.time_budget}  # each test under a limit, as later (the whole budget)
    with workspace(sandbox, repo) as ws:
        suite = run_suite(ws, repo, repo.time_budget, guarding=guarding)
    failures = sum(outcome in ("failed", "error") for outcome in suite.tests.values())
    imported = [path for path in suite.imported if path.endswith(".py") and not is_test_path(path)]
    lines_run = None
    if suite.status == "ok":
        with workspace(sandbox, repo) as ws:
            traced = run_suite(ws, repo, repo.time_budget, guarding={**guarding, "trace_lines": True})
        if traced.status == "ok" and traced.lines_run is not None:
            lines_run = {path: traced.lines_run.get(path, []) for path in imported}
    return Baseline(
        repo=repo.name,
        key=repo.key(),
        status=suite.status,
        tests=suite.tests,
        durations=suite.durations,
        test_count=len(suite.tests),
        failures=failures,
        duration=suite.duration,
        imported_files=imported,
        lines_run=lines_run,
        machinery_changes=suite.machinery,
        detail=suite.detail,
    )


class Check(BaseModel):
    valid: bool
    reason: str | None = None
    failing_tests: list[str] = Field(default_factory=list)
    outcomes: dict[str, int] = Field(default_factory=dict)
    seconds: float = 0.0
    replay: Replay | None = Field(None, description="what a fix must answer again outside the tests (``replay``)")


def apply_diffs(ws, diffs: list[str]) -> str | None:
    """Apply each diff in order with ``git apply`` (exact context, no fuzz), as its hunks count their
    lines or, where a hand-edited diff miscounts them, with ``--recount`` (which, counting to the next
    hunk, would read a plain ``diff -u``'s next ``--- a/`` header as a removed line); the reason the
    first that does not apply fails, or None. A diff's bytes that are no UTF-8 (a Latin-1 file's line)
    come as the lone surrogates ``final_diff`` read them into, and go back as those bytes."""
    for number, diff in enumerate(diffs):
        name = f"{OUT_DIR}/change{number}.diff"
        try:
            data = (diff if diff.endswith("\n") else diff + "\n").encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no file's bytes read into: no diff of a file holds it
            return "does not apply: the diff holds characters no file's bytes read as (lone surrogates)"
        ws.write(name, data)
        applied = ws.run(f"git apply {shlex.quote(name)} || git apply --recount {shlex.quote(name)}")
        if applied.returncode != 0:
            return f"does not apply: {(applied.stderr.strip().splitlines() or ['git apply failed'])[-1][:300]}"
    return None


def _allowed(baseline: Baseline) -> set[str] | None:
    return set(baseline.imported_files) or None


def verify_bug(
    sandbox,
    repo: RepoSpec,
    baseline: Baseline,
    diff: str,
    sources: dict[str, str] | None = None,
    keep_unjudged: bool = True,
) -> Check:
    """W(x) for a bug, on a fresh clean checkout: it applies (``apply_diffs``, no fuzz); it
    only modifies source files the suite imports (``diffs``) and passes the static screen
    (``screen``; ``sources``: the clean checkout's code, path -> source); the suite, run with our
    report plugin, leaves tests, their configuration and code untouched, collects exactly the
    baseline's tests, and at least one test that passed in the baseline now fails inside the test
    (not in collection or set-up); and each such test (up to ``RECHECKS``) fails again run alone in
    a fresh process, under both runners (``recheck_failures``). Where the calls its failing tests make
    into the repository could be recorded (``record_calls``), the bug's code is replayed on them
    outside the tests (``replay``), and ``Check.replay`` holds those calls, the original's answers and
    how many of them the bug's code answers otherwise (``changed``). A bug that changes none is kept on
    the other layers' judgment; with ``keep_unjudged`` false it is refused where every call was
    recorded (its effect may otherwise lie in a call nobody recorded)."""
    started = time.monotonic()

    def invalid(reason: str, **fields: Any) -> Check:
        return Check(valid=False, reason=reason, seconds=time.monotonic() - started, **fields)

    if not diff.strip():
        return invalid("empty diff: nothing changed")
    budget = suite_budget(repo, baseline)
    with workspace(sandbox, repo) as ws:
        clean = snapshot(ws)
        reason = apply_diffs(ws, [diff])
        if reason:
            return invalid(reason)
        try:
            applied = snapshot(ws)
        except PropelError as exc:  # what the change made cannot be listed: it is not judged, it is refused
            return invalid(f"the checkout cannot be listed after the change: {exc}")
        if applied == clean:
            return invalid("the diff changes nothing")
        if problems := change_problems(clean, applied, _allowed(baseline)):
            return invalid("; ".join(problems[:5]))
        if refused := screened(ws, sources or {}, clean, applied):
            return invalid(f"the screen refuses: {'; '.join(refused[:5])}")
        guarding = guard_orders(written_by(ws, sources or {}, clean, applied), baseline)
        try:
            seal(ws)
        except PropelError as exc:  # the sandbox failed: the bug is not judged, as when its suite cannot run
            return invalid(str(exc))
        suite, problems = checked_run(ws, repo, budget, applied, guarding=guarding)
        if problems:
            return invalid("; ".join(problems[:5]))
    if suite.status != "ok":
        return invalid(f"the suite did not run ({suite.status}): {suite.detail}")
    outcomes = dict(Counter(suite.tests.values()))
    missing, new = set(baseline.tests) - set(suite.tests), set(suite.tests) - set(baseline.tests)
    if missing or new:
        reason = f"the suite collects other tests ({len(missing)} gone, {len(new)} new): sabotage, not a bug"
        return invalid(reason, outcomes=outcomes)
    passed_before = [test for test, outcome in baseline.tests.items() if outcome == "passed"]
    failing = [test for test in passed_before if suite.tests[test] == "failed"]
    if not failing:
        errored = sum(suite.tests[test] == "error" for test in passed_before)
        denied = sum(suite.tests[test] == "refused" for test in passed_before)
        reason = "no previously passing test fails"
        if errored:
            reason += f" ({errored} now error in collection or set-up: sabotage, not a bug)"
        if denied:
            reason += f" ({denied} ran into the guard: the change asked to {'; '.join(suite.refused) or '?'})"
        return invalid(reason, outcomes=outcomes)
    if reason := recheck_failures(sandbox, repo, diff, failing[:RECHECKS], budget, guarding):
        return invalid(reason, outcomes=outcomes)
    try:
        replay = record_calls(sandbox, repo, baseline, failing, budget)
    except PropelError:  # the original code could not be recorded or replayed: no calls to judge on
        replay = Replay()
    if replay.judged:
        try:
            answers = change_answers(sandbox, repo, [diff], replay, budget, guarding)
        except PropelError as exc:
            return invalid(f"the bug's replay could not run: {exc}", outcomes=outcomes)
        if answers is None:
            return invalid("the bug's code gave no answer to the calls its failing tests make outside the tests")
        # a bug the replay cannot see (a wrong text it does not describe, an effect in a call nobody
        # recorded) is kept on the other layers' judgment, and the replay records that it did not judge it
        replay.changed = len(differing(replay, answers, of_a_fix=False))
        if not replay.changed and replay.recorded_all and not keep_unjudged:
            return invalid(
                f"the bug changes no answer to the {replay.judged} calls its failing tests make into the "
                "repository, made again outside the tests",
                outcomes=outcomes,
            )
    return Check(
        valid=True, failing_tests=failing, outcomes=outcomes, seconds=time.monotonic() - started, replay=replay
    )


def recheck_failures(
    sandbox, repo: RepoSpec, diff: str, tests: list[str], budget: float, guarding: dict[str, Any]
) -> str | None:
    """Why the ``tests`` a bug fails do not fail again, each alone on a fresh checkout with the bug,
    under both runners: pytest with our report plugin in a fresh process (a failure that needs the
    rest of the suite), and the second runner (``second_run``) without propel's plugin or
    environment, twice, with the clock moved ahead (``clock_shifts``): a failure that our runner,
    the environment or the date makes, or a verdict forged for one runner. None when each fails under both. A
    checkout per test: nothing one run leaves behind (a configuration file, a package's metadata)
    reaches the next."""
    for test in tests:
        with workspace(sandbox, repo) as ws:
            if reason := apply_diffs(ws, [diff]):
                return reason
            applied = snapshot(ws)
            try:
                seal(ws)
            except PropelError as exc:
                return f"{test} run alone: {exc}"
            alone, problems = checked_run(ws, repo, budget, applied, [test], guarding)
            if alone.status != "ok":
                return f"{test} run alone: the suite did not run ({alone.status}): {alone.detail}"
            if problems:
                return "; ".join(problems[:5])
            if alone.tests != {test: "failed"}:
                return f"{test} does not fail when run alone (got {alone.tests or 'nothing'})"
            seconds = [(shift, second_run(ws, repo, [test], budget, shift, guarding)[test]) for shift in clock_shifts()]
        for shift, second in seconds:
            if second != "failed":
                return (
                    f"{test} does not fail under the second runner (no propel plugin or environment, the clock "
                    f"{shift / 86400 / 365.25:.1f} years ahead): {second}; the runners disagree"
                )
    return None


def grade_fix(
    sandbox,
    repo: RepoSpec,
    baseline: Baseline,
    bug: str,
    fix: str,
    sources: dict[str, str] | None = None,
    failing_tests: list[str] | None = None,
    replay: Replay | None = None,
) -> tuple[bool | None, str | None, dict[str, Any]]:
    """(solved, reason, diagnostics): solved iff, on a clean checkout with the bug and then the fix
    applied, every test that passed in the baseline passes again, and the bug's failing tests
    (``failing_tests``) that verification ran again alone (the first ``RECHECKS``) pass under the
    second runner too, each alone in a process of its own, as verification judged them. The fix is held to the bug's
    rules: it must apply, change something, only modify source files the suite imports, pass the
    static screen (``sources``: the clean checkout's code), and the run must leave tests, their
    configuration and code untouched and report untampered within the budget the bug alone ran in;
    and with a ``replay`` (``verify_bug``), the fixed code must give the original's answer to each of
    its calls, outside the tests, on a fresh checkout (``change_answers``); otherwise it is not solved.
    None (ungradable) only when the sandbox itself failed."""
    started = time.monotonic()
    allowed, budget = _allowed(baseline), suite_budget(repo, baseline)
    with workspace(sandbox, repo) as ws:
        clean = snapshot(ws)
        if reason := apply_diffs(ws, [bug]):
            return None, f"the bug no longer applies: {reason}", {}
        buggy = snapshot(ws)
        if problems := change_problems(clean, buggy, allowed):
            return None, f"the bug breaks the rules for a change: {'; '.join(problems[:5])}", {}
        buggy_sources = changed_sources(ws, clean, buggy)  # the fix is screened against the bug
        if reason := apply_diffs(ws, [fix]):
            return False, f"fix {reason}", {}
        try:
            fixed = snapshot(ws)
        except PropelError as exc:  # what the fix made cannot be listed: not solved, never ungradable
            return False, f"the checkout cannot be listed after the fix: {exc}", {}
        if fixed == buggy:
            return False, "the fix changes nothing", {}
        if problems := change_problems(buggy, fixed, allowed):
            return False, f"fix rejected: {'; '.join(problems[:5])}", {}
        if refused := screened(ws, {**(sources or {}), **buggy_sources}, buggy, fixed, sources):
            return False, f"fix refused by the screen: {'; '.join(refused[:5])}", {}
        guarding = guard_orders(written_by(ws, sources or {}, clean, fixed), baseline)
        try:
            seal(ws)
        except PropelError as exc:
            return None, str(exc), {}
        suite, problems = checked_run(ws, repo, budget, fixed, guarding=guarding)
        if problems:
            return False, "; ".join(problems[:5]), {}
        diagnostics: dict[str, Any] = {"seconds": time.monotonic() - started}
        if suite.status == "sandbox_error":
            return None, f"the suite did not run ({suite.status}): {suite.detail}", diagnostics
        if suite.status != "ok":  # the bug alone ran and reported within budget: the fix did this
            return False, f"the suite with the fix did not report ({suite.status}): {suite.detail}", diagnostics
        passed_before = [test for test, outcome in baseline.tests.items() if outcome == "passed"]
        broken = [test for test in passed_before if suite.tests.get(test) != "passed"]
        diagnostics["still_failing"] = len(broken)
        if broken:
            denied = sum(suite.tests.get(test) == "refused" for test in broken)
            why = (
                f"; {denied} ran into the guard (the fix asked to {'; '.join(suite.refused) or '?'})" if denied else ""
            )
            return (
                False,
                f"{len(broken)} baseline-passing tests do not pass (failed, missing or skipped){why}",
                diagnostics,
            )
        rechecked = list(failing_tests or [])[:RECHECKS]  # as verification judged them: the same tests,
        judged = replay.judged if replay is not None else 0  # each alone in a process of its own
        diagnostics["judged_by"] = {"suite": len(passed_before), "second_runner": rechecked, "replayed": judged}
        for test in rechecked:
            if (second := second_run(ws, repo, [test], budget, guarding=guarding)[test]) != "passed":
                reason = f"{test} does not pass under the second runner ({second}); the runners disagree"
                return False, reason, diagnostics
    if judged:
        try:
            answers = change_answers(sandbox, repo, [bug, fix], replay, budget, guarding)
        except PropelError as exc:
            return None, str(exc), diagnostics
        if wrong := differing(replay, answers, of_a_fix=True):
            return (
                False,
                f"{len(wrong)} of the {judged} calls the bug's failing tests make answer otherwise outside the "
                f"tests; first, {told(replay, answers, wrong[0])}",
                diagnostics,
            )
    diagnostics["seconds"] = time.monotonic() - started
    return True, None, diagnostics


def node_ids(tests: list[str], baseline: Baseline) -> list[str]:
    """A task's failing tests as the pytest node ids of the baseline (``tests/test_x.py::Case::test``).
    Tasks written before the runners read node ids stored JUnit names (``tests.test_x.Case::test``):
    each is read as the baseline test it names. A PropelError names a test that is neither, and the
    way out."""
    junit = {}
    for node in baseline.tests:
        path, _, rest = node.partition("::")
        *classes, name = rest.split("::")
        if path.endswith(".py") and name:
            junit.setdefault(".".join([path[:-3].replace("/", "."), *classes]) + "::" + name, node)
    found, unknown = [], []
    for test in tests:
        if test in baseline.tests or test in junit:
            found.append(test if test in baseline.tests else junit[test])
        else:
            unknown.append(test)
    if unknown:
        raise PropelError(
            f"the task's failing test {unknown[0]!r} is neither a test of {baseline.repo}'s baseline nor the "
            "JUnit name of one: the task was verified against another state of the repository; verify it again "
            "(propel label on a fresh generate) to store its failing tests as node ids"
        )
    return found


def clock_shifts() -> list[int]:
    """The two clock shifts (seconds ahead) a bug's failing test runs under (``CLOCK_SHIFT_DAYS``)."""
    low, high = (days * 86400 for days in CLOCK_SHIFT_DAYS)
    return [high - secrets.randbelow(86400), low + secrets.randbelow(high - low)]


def second_run(
    ws,
    repo: RepoSpec,
    tests: list[str],
    time_limit: float,
    shift_clock: int = 0,
    guarding: dict[str, Any] | None = None,
) -> dict[str, str]:
    """The ``tests``' outcomes under the second runner (``second_runner``), in a fresh process of its
    own (``fresh_process``) with the guard beside it (``guarding``: what the guard is told); with
    ``shift_clock`` (seconds), under libfaketime with the clock moved that far ahead. Each outcome is
    passed, failed, skipped, error or tampered (the change replaced what judges a test), or why no
    trustworthy answer came."""
    clock, faked = "", ["LD_PRELOAD", "FAKETIME"]  # taken out of what the code under test reads (``as_a_user``)
    if shift_clock:  # libfaketime preloaded: the faketime wrapper needs shared memory the sandbox does not give
        clock = f"LD_PRELOAD={faketime_library()} FAKETIME=+{int(shift_clock)}"
    orders = {"tests": tests, "root": repo.workdir, "faked": faked if shift_clock else [], **(guarding or {})}
    line, why = fresh_process(ws, repo, SECOND_RUNNER, orders, time_limit, clock)
    outcomes = line.split(" ") if line is not None else []
    if line is not None and (len(outcomes) != len(tests) or not set(outcomes) <= {*OUTCOMES, "tampered"}):
        why = "not one outcome a test"
    if why:
        return dict.fromkeys(tests, f"no answer ({why})")
    return dict(zip(tests, outcomes, strict=True))


def fresh_process(
    ws,
    repo: RepoSpec,
    script: bytes,
    orders: dict[str, Any],
    time_limit: float,
    assignments: str = "",
    elsewhere: bool = False,
) -> tuple[str | None, str]:
    """Run one of our scripts (the second runner, the replayer) in one fresh process whose environment
    is the tests' own (``test_environment``: the sandbox's, the registry's variables and
    ``PYTHONPATH``, nothing of propel's, and ``assignments``), started from a file in a fresh folder of
    its own with the guard beside it, each under a name drawn per run. It reads ``orders`` (to which the
    guard's module name, a per-run nonce and descriptor, and the test command's arguments are added)
    and answers with one line on that descriptor, which must start with the nonce; the watcher
    (``watcher``) reads that descriptor first and keeps the time limits the script asks for.
    ``elsewhere``: it runs in a copy of the checkout in that fresh folder, under a name drawn per run,
    not where the runners run. (what follows the nonce, ""), or (None, why no trustworthy answer
    came)."""
    source, nonce = f"{OUT_DIR}/{secrets.token_hex(8)}", secrets.token_hex(16)
    fd = 4 + secrets.randbelow(6)  # not 3, the first runner's; bash keeps 10 and up for itself
    made = ws.run(f"mkdir -m 755 {source}")
    if made.returncode != 0:
        return None, f"could not prepare the run: {made.stderr.strip()[-200:]}"
    name, orders_name, guard = f"r{secrets.token_hex(6)}", f"o{secrets.token_hex(6)}", f"g{secrets.token_hex(6)}"
    watcher = f"w{secrets.token_hex(6)}"
    copy = f"$d/w{secrets.token_hex(6)}"
    prelude, test_command = test_environment(repo, copy if elsewhere else None)
    told = {**orders, "nonce": nonce, "fd": fd, "guard": guard, "argv": command_arguments(test_command)}
    ws.write(f"{source}/runner.py", script)
    ws.write(f"{source}/guard.py", GUARD)
    ws.write(f"{source}/watcher.py", WATCHER)
    ws.write(f"{source}/orders.json", json.dumps(told).encode())
    copied = f" && cp -a {shlex.quote(repo.workdir)}/. {copy}" if elsewhere else ""
    command = (
        f"python=$(command -v python) && d=$(mktemp -d) && cp {source}/runner.py $d/{name}.py && "
        f"cp {source}/guard.py $d/{guard}.py && cp {source}/watcher.py $d/{watcher}.py && "
        f"cp {source}/orders.json $d/{orders_name}.json && rm -rf {source}{copied} || exit 1\n{prelude}\n"
        f"{assignments} $python $d/{name}.py $d/{orders_name}.json {fd}>&1 >$d/log 2>&1 | "
        f"$python -I -S $d/{watcher}.py {nonce}"
    )
    result = ws.run(command, time_limit=time_limit)
    if result.status not in ("ok", "error"):
        return None, result.status
    lines = result.stdout.splitlines()
    if len(lines) != 1 or not lines[0].startswith(nonce + " "):
        return None, f"{len(lines)} lines on its descriptor"
    return lines[0][len(nonce) + 1 :], ""


def command_arguments(test_command: str) -> list[str]:
    """The test command's own arguments, after ``pytest`` (``python -m pytest -q`` -> ``["-q"]``): what
    the second runner puts in ``sys.argv`` after pytest's ``__main__`` (and in ``sys.orig_argv`` after
    ``-m pytest``), as the first runner's process has them (``guard.as_a_user``; the replayer reads as
    a user's ``python -``)."""
    words = shlex.split(test_command)
    at = next((index for index, word in enumerate(words) if word.rsplit("/", 1)[-1] == "pytest"), len(words))
    return words[at + 1 :]


def record_calls(sandbox, repo: RepoSpec, baseline: Baseline, tests: list[str], budget: float) -> Replay:
    """The replay of a bug (``replay``): on a fresh clean checkout, the calls its failing ``tests``
    make into the repository's imported source files, recorded by the recorder plugin in a run of the
    test command; then the original code's answers to them, twice, each in a fresh process (the first
    also making calls of its own, ``VARIANTS`` per recorded call, from a seed drawn here). A
    PropelError where the recording or the replays could not run."""
    with workspace(sandbox, repo) as ws:
        folder, plugin = f"{OUT_DIR}/record-{secrets.token_hex(8)}", f"r{secrets.token_hex(6)}"
        if ws.run(f"mkdir -m 755 {folder}").returncode != 0:
            raise PropelError("could not prepare the recording")
        ws.write(f"{folder}/{plugin}.py", RECORDER)
        orders = recording_orders(repo.workdir, tests, baseline.imported_files, f"{folder}/calls.json")
        ws.write(f"{folder}/orders.json", json.dumps(orders).encode())
        prelude, test_command = test_environment(repo)
        ran = ws.run(
            f"{prelude}\nexport PYTHONPATH={folder}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"PYTEST_PLUGINS={plugin}${{PYTEST_PLUGINS:+,$PYTEST_PLUGINS}}\n{{ {test_command}\n}} >{folder}/log 2>&1",
            time_limit=budget,
        )
        try:
            written = json.loads(ws.read(f"{folder}/calls.json"))
            recorded, skipped, paths = written["calls"], written["skipped"], written["paths"]
        except (OSError, PropelError, ValueError, KeyError, TypeError) as exc:
            raise PropelError(f"the recording wrote no calls ({ran.status}): {exc}") from exc
        seal(ws)
        calls, hash_seed = [call["call"] for call in recorded], 1 + secrets.randbelow(HASH_SEEDS)
        first = replay_answers(
            ws, repo, Replay(calls=calls, paths=paths, hash_seed=hash_seed), budget, None, secrets.randbits(64)
        )
        if first is None:
            raise PropelError("the original code gave no answer to the recorded calls")
        answered = [
            (call, answer)
            for call, answer in zip(in_order(recorded, first["made"]), first["answers"], strict=False)
            if answer[1] != TIMEOUT  # a change's replay would end there: the call is not made again
        ]
        kept = Replay(calls=[made[0] for made, _ in answered], paths=paths, hash_seed=hash_seed)
        second = replay_answers(ws, repo, kept, budget, None)
    calls_made, answers = [made for made, _ in answered], [answer for _, answer in answered]
    replay = of_the_original(calls_made, answers, second, paths, not skipped and len(answered) == len(first["answers"]))
    replay.hash_seed = hash_seed
    return replay


def change_answers(
    sandbox, repo: RepoSpec, diffs: list[str], replay: Replay, budget: float, guarding: dict[str, Any]
) -> list[list[str]] | None:
    """What the code with ``diffs`` applied answers to the calls of ``replay`` (``replay_answers``),
    on a fresh checkout that has never run it (nothing a run of the suite left in a checkout reaches
    the replay), sealed (``seal``); None where no trustworthy answer came."""
    with workspace(sandbox, repo) as ws:
        if apply_diffs(ws, diffs):
            return None
        seal(ws)
        answered = replay_answers(ws, repo, replay, budget, guarding)
    return answered["answers"] if answered is not None else None


def replay_answers(
    ws, repo: RepoSpec, replay: Replay, budget: float, guarding: dict[str, Any] | None, seed: int | None = None
) -> dict[str, Any] | None:
    """What the replayer answers to the calls of ``replay`` in a fresh process on checkout ``ws``
    (``replay.answers_of``), or None where no trustworthy answer came. ``guarding``: what the guard is
    told about a change, whose replay ends at its first call past its time; None for the original
    code, which makes every call. The process starts with the replay's string hash seed
    (``PYTHONHASHSEED``, unless the tests' environment sets one), so that a set of strings iterates
    in one order in the original's replays and a change's; the replayer takes it out of what the code
    under test reads (``guard.as_a_user``), and a change cannot set it for a process already started."""
    orders = {
        "calls": replay.calls,
        "paths": replay.paths,
        "root": None,  # the copy of the checkout it runs in
        "time_limit": CALL_SECONDS,
        "seed": seed,
        "variants": VARIANTS,
        "stop_when_late": guarding is not None,
        "hash_seed": replay.hash_seed,
    }
    hashing = f"PYTHONHASHSEED=${{PYTHONHASHSEED:-{int(replay.hash_seed)}}}" if replay.hash_seed is not None else ""
    line, _ = fresh_process(ws, repo, REPLAYER, {**orders, **(guarding or {})}, budget, hashing, elsewhere=True)
    return answers_of(line) if line is not None else None


def seal(ws) -> None:
    """Leave nothing of the original code in the checkout before a change's code runs in it: its git
    history (git's objects hold the clean files, which a change could load and run where they are)
    and everything in the harness's folder (the diffs applied, the bug's among them, which read
    backwards is the clean code)."""
    removed = ws.run(f"python -I -S -c {shlex.quote(SEAL)} {OUT_DIR}")
    if removed.returncode != 0:
        raise PropelError(f"could not clear the checkout for the change: {removed.stderr.strip()[-300:]}")


def changed_sources(ws, old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """The sources of the code files that changed between snapshots ``old`` and ``new``."""
    changed = [path for path, entry in new.items() if entry != old.get(path) and path.endswith(".py")]
    return {
        path: ws.read(path).decode(errors="replace") for path in changed if not new[path].startswith(("dir", "link"))
    }


def guard_orders(written: dict[str, list[int]], baseline: Baseline) -> dict[str, Any]:
    """What both runners tell the guard: the lines the change wrote, the functions and classes of
    the runners' machinery that the clean suite itself changes (pytest's own plugins, a repository's
    conftest), which are no sign of tampering, and each test's time limit (``time_limits``)."""
    return {"written": written, "machinery": baseline.machinery_changes, "time_limits": time_limits(baseline)}


def time_limits(baseline: Baseline) -> dict[str, float]:
    """Seconds each phase of a test (set-up, call, tear-down) may run with a change applied:
    ``TEST_TIME_FACTOR`` times what the whole test took in the preflight, at least
    ``MIN_TEST_SECONDS``. Past it the test fails (a set-up or tear-down is an error), as a hang is a
    failure: a bug that makes a test loop for ever is judged on that test instead of the whole suite
    running out of its budget. A test the preflight gave no duration (a baseline cached before
    durations were recorded) has no limit of its own."""
    return {test: max(MIN_TEST_SECONDS, TEST_TIME_FACTOR * seconds) for test, seconds in baseline.durations.items()}


def written_by(ws, sources: dict[str, str], clean: dict[str, str], now: dict[str, str]) -> dict[str, list[int]]:
    """The lines of each code file that differ between snapshots ``clean`` and ``now`` (line numbers
    in ``now``), which the guard denies its capabilities to; ``sources``: the clean files' code."""
    written = {}
    for path, text in changed_sources(ws, clean, now).items():
        before = sources[path] if path in sources else _committed(ws, path)
        if lines := written_lines(before, text):
            written[path] = lines
    return written


def screened(
    ws, before: dict[str, str], old: dict[str, str], new: dict[str, str], original: dict[str, str] | None = None
) -> list[str]:
    """What the static screen (``screen``) refuses in the change between snapshots ``old`` and ``new``;
    ``before`` holds the changed files' sources at ``old`` (a file missing there is read from the
    checkout's last commit), ``original`` the clean ones."""
    after = changed_sources(ws, old, new)
    prior = {path: before[path] if path in before else _committed(ws, path) for path in after}
    return screen(prior, after, original)


def _committed(ws, path: str) -> str:
    shown = ws.run(f"git show HEAD:{shlex.quote(path)}")
    return shown.stdout if shown.returncode == 0 else ""


def faketime_library() -> str:
    """The path of libfaketime (Debian's ``faketime``/``libfaketime`` packages), which moves the clock of
    a process it is preloaded into; a PropelError naming the package when it is missing."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        raise PropelError("the swe domain's clock recheck needs libfaketime: apt-get install faketime")
    return found[0]
