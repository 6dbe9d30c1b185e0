"""Running a repository's test suite, its baseline (preflight), and the two verdicts built on it:
is a diff a real bug (the validity predicate), and does a fix solve it (the solver's grade).

Every check starts from a fresh, clean checkout in a fresh sandbox, so nothing an agent did to its
own workspace (its git metadata included) can reach a verdict. Results come from the runner's JUnit
XML report, never from what the code under test prints.
"""

from __future__ import annotations

import shlex
import time
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from propel_core.errors import PropelError
from propel_plugins.sandbox import OUT_DIR
from propel_swe.diffs import check_diff, is_test_path
from propel_swe.junit import parse_junit
from propel_swe.repos import RepoSpec

REPORT = f"{OUT_DIR}/junit.xml"
MAX_BASELINE_FAILURES = 1  # paper 13.1


class SuiteRun(BaseModel):
    status: str = Field(description="ok: the suite ran and wrote its report; else timeout, no_report, ...")
    tests: dict[str, str] = Field(default_factory=dict)
    duration: float = 0.0
    detail: str | None = None


class Baseline(BaseModel):
    """Preflight: the suite once on the unmodified checkout (paper 13.1)."""

    repo: str
    key: str
    status: str
    tests: dict[str, str] = Field(default_factory=dict)
    test_count: int = 0
    failures: int = 0
    duration: float = 0.0
    test_hashes: dict[str, str] = Field(default_factory=dict)
    detail: str | None = None

    @property
    def reasons(self) -> list[str]:
        """Why the repository is dropped; empty when it is kept."""
        reasons = []
        if self.status != "ok":
            reasons.append(f"status {self.status}" + (f": {self.detail}" if self.detail else ""))
        if self.test_count == 0:
            reasons.append("no tests")
        if self.failures > MAX_BASELINE_FAILURES:
            reasons.append(f"{self.failures} baseline failures (at most {MAX_BASELINE_FAILURES})")
        return reasons

    @property
    def keep(self) -> bool:
        return not self.reasons


def workspace(sandbox, repo: RepoSpec):
    return sandbox.workspace(path=repo.path, image=repo.image, workdir=repo.workdir)


def run_suite(ws, repo: RepoSpec) -> SuiteRun:
    """Run the test command with a JUnit report in ``OUT_DIR``; the outcome of each test from it."""
    command = repo.test_command
    command = command.replace("{junit}", REPORT) if "{junit}" in command else f"{command} --junitxml={REPORT}"
    ws.run(f"rm -f {REPORT}")
    result = ws.run(command, time_limit=repo.time_budget)
    if result.status in ("timeout", "sandbox_error"):
        return SuiteRun(status=result.status, duration=result.duration, detail=result.detail)
    try:
        tests = parse_junit(ws.read(REPORT))
    except (FileNotFoundError, PropelError) as exc:
        tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        return SuiteRun(status="no_report", duration=result.duration, detail=f"{exc}; output ends: {' | '.join(tail)}")
    return SuiteRun(status="ok", tests=tests, duration=result.duration)


def test_hashes(ws) -> dict[str, str]:
    """Git blob hashes of every tracked test and test-configuration file, by content."""
    listed = ws.run("git ls-files -z")
    if listed.returncode != 0:
        raise PropelError(f"git ls-files failed in the workspace: {listed.stderr.strip()[-300:]}")
    paths = [path for path in listed.stdout.split("\0") if path and is_test_path(path)]
    if not paths:
        return {}
    ws.write(f"{OUT_DIR}/test-paths", "\n".join(paths).encode() + b"\n")
    hashed = ws.run(f"git hash-object --no-filters --stdin-paths < {OUT_DIR}/test-paths")
    return dict(zip(paths, hashed.stdout.split(), strict=False))


def preflight(sandbox, repo: RepoSpec) -> Baseline:
    """Run the suite once on the clean checkout: status, test count, duration, failures, per-test."""
    with workspace(sandbox, repo) as ws:
        hashes = test_hashes(ws)
        suite = run_suite(ws, repo)
    failures = sum(outcome in ("failed", "error") for outcome in suite.tests.values())
    return Baseline(repo=repo.name, key=repo.key(), status=suite.status, tests=suite.tests,
                    test_count=len(suite.tests), failures=failures, duration=suite.duration, test_hashes=hashes,
                    detail=suite.detail)  # fmt: skip


class Check(BaseModel):
    valid: bool
    reason: str | None = None
    failing_tests: list[str] = Field(default_factory=list)
    outcomes: dict[str, int] = Field(default_factory=dict)
    seconds: float = 0.0


def apply_diffs(ws, diffs: list[str]) -> str | None:
    """Apply each diff in order with ``git apply --recount`` (exact context, no fuzz); the reason
    the first that does not apply fails, or None."""
    for number, diff in enumerate(diffs):
        name = f"{OUT_DIR}/change{number}.diff"
        ws.write(name, diff.encode() if diff.endswith("\n") else (diff + "\n").encode())
        applied = ws.run(f"git apply --recount {shlex.quote(name)}")
        if applied.returncode != 0:
            return f"does not apply: {(applied.stderr.strip().splitlines() or ['git apply failed'])[-1][:300]}"
    return None


def verify_bug(sandbox, repo: RepoSpec, baseline: Baseline, diff: str) -> Check:
    """W(x) for a bug: our diff checks pass, it applies to a clean checkout, test files are unchanged
    (also by content hash), the suite collects the same tests, and at least one test that passed in
    the baseline now fails inside the test (not in collection or set-up)."""
    started = time.monotonic()
    static = check_diff(diff)
    if not static.ok:
        return Check(valid=False, reason=static.reason)
    with workspace(sandbox, repo) as ws:
        reason = apply_diffs(ws, [diff])
        if reason:
            return Check(valid=False, reason=reason, seconds=time.monotonic() - started)
        if test_hashes(ws) != baseline.test_hashes:
            return Check(valid=False, reason="test files changed", seconds=time.monotonic() - started)
        suite = run_suite(ws, repo)
        if suite.status == "ok" and test_hashes(ws) != baseline.test_hashes:
            return Check(valid=False, reason="the code under test changed test files while the suite ran",
                         seconds=time.monotonic() - started)  # fmt: skip
    seconds = time.monotonic() - started
    if suite.status != "ok":
        return Check(valid=False, reason=f"the suite did not run ({suite.status}): {suite.detail}", seconds=seconds)
    outcomes = dict(Counter(suite.tests.values()))
    missing, new = set(baseline.tests) - set(suite.tests), set(suite.tests) - set(baseline.tests)
    if missing or new:
        reason = f"the suite collects other tests ({len(missing)} gone, {len(new)} new): sabotage, not a bug"
        return Check(valid=False, reason=reason, outcomes=outcomes, seconds=seconds)
    passed_before = [test for test, outcome in baseline.tests.items() if outcome == "passed"]
    failing = [test for test in passed_before if suite.tests[test] == "failed"]
    if not failing:
        errored = sum(suite.tests[test] == "error" for test in passed_before)
        reason = "no previously passing test fails"
        if errored:
            reason += f" ({errored} now error in collection or set-up: sabotage, not a bug)"
        return Check(valid=False, reason=reason, outcomes=outcomes, seconds=seconds)
    return Check(valid=True, failing_tests=failing, outcomes=outcomes, seconds=seconds)


def grade_fix(
    sandbox, repo: RepoSpec, baseline: Baseline, bug: str, fix: str
) -> tuple[bool | None, str | None, dict[str, Any]]:
    """(solved, reason, diagnostics): solved iff, on a clean checkout with the bug and then the fix
    applied, every test that passed in the baseline passes again. A fix that touches tests or does
    not apply is not a solution; None when the suite could not run (ungradable)."""
    started = time.monotonic()
    static = check_diff(fix)
    if not static.ok:
        return False, f"fix rejected: {static.reason}", {}
    with workspace(sandbox, repo) as ws:
        reason = apply_diffs(ws, [bug, fix])
        if reason:
            return False, f"fix {reason}", {}
        suite = run_suite(ws, repo)
    diagnostics = {"seconds": time.monotonic() - started}
    if suite.status != "ok":
        return None, f"the suite did not run ({suite.status})", diagnostics
    passed_before = [test for test, outcome in baseline.tests.items() if outcome == "passed"]
    broken = [test for test in passed_before if suite.tests.get(test) != "passed"]
    diagnostics["still_failing"] = len(broken)
    if broken:
        return False, f"{len(broken)} baseline-passing tests do not pass", diagnostics
    return True, None, diagnostics
