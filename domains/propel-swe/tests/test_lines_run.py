"""The procedural generator plants bugs only on lines the suite runs: preflight traces the clean suite
once (``Baseline.lines_run``), in the real local sandbox, and code a test imports but never runs (a
function no test calls, another platform's branch) gives no bug, since no test could fail on it."""

import shutil
from pathlib import Path

from conftest import DATA, local_domain
from test_procedural_runs import MUTANTS

from propel_core.domain import ParseError
from propel_swe.checkout import git_checkout

#: appended to the tiny repository's core.py: imported by every test, run by none but two lines (the
#: ``if`` and the ``def``), which hold no mutation site
NEVER_RUN = (
    "\n\nif __import__('os').name.startswith('nt'):\n    WIDTH = 80 - 1\n\n\n"
    "def shift(x):\n    if x > 0:\n        return x + 1\n    return x - 1\n"
)


def mutated_lines(domain) -> list[tuple[str, int]]:
    """(file, line) of each of the repository's mutants, from the episode's description of it."""
    found = []
    for context in domain.episode_contexts(domain.contexts() * (MUTANTS + 20), seed=0):
        try:
            payload = domain.parse(domain.episode(context, None, seed=0))
        except ParseError:  # no mutant left
            return found
        path, line = payload["turns"][0].split("\n", 1)[0].rsplit(" at ", 1)[1].split(":")
        found.append((path, int(line)))
    raise AssertionError("more mutants than expected")


def test_no_bug_in_code_the_suite_imports_but_never_runs(test_env, tmp_path):
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path / "tinystats"))
    core = repo / "tinystats" / "core.py"
    ran_until = len(core.read_text().splitlines())  # every line of the shipped core.py is tested
    core.write_text(core.read_text() + NEVER_RUN)
    domain = local_domain("tinystats", git_checkout(repo), test_env, tmp_path, generator="procedural")

    baseline = domain.baseline(domain.repos["tinystats"])
    assert baseline.keep and baseline.test_count == 7
    run = set(baseline.lines_run["tinystats/core.py"])
    assert {line for line in run if line > ran_until} == {ran_until + 3, ran_until + 7}  # the `if` and the `def`
    lines = mutated_lines(domain)
    assert len(lines) == MUTANTS  # the shipped repository's bugs, and none more
    assert all(path == "tinystats/core.py" and line <= ran_until for path, line in lines), lines
