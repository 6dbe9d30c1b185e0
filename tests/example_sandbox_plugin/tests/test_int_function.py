"""The int_function domain's own tests. Run them with `pytest` once the package is installed
(`pip install -e .`); the grading tests need a sandbox that works on this machine and are skipped,
saying why, where there is none (docs/sandbox.md lists what the local sandbox needs)."""

from types import SimpleNamespace

import pytest

from propel_core import ParseError, Unavailable, hookimpl
from propel_core.testing import assert_same_verdicts_concurrently

# a test run that collects this folder without the package installed (the propel repository's own
# suite, which keeps the package as an example) skips this file instead of failing on it
pytest.importorskip("propel_int_function", reason="the package is not installed: pip install -e .")

TASK = {"description": "f(n) returns n times n plus one", "examples": [[2, 5], [0, 1], [-3, 10], [10, 101]]}
RIGHT = "```python\ndef f(n):\n    return n * n + 1\n```"
WRONG = "```python\ndef f(n):\n    return 2 * n + 1\n```"


def test_shows_up(propel_registry):
    assert "int_function" in propel_registry.names("domains")


@pytest.fixture
def domain(propel_registry):
    # Registry.domain, not propel_registry.get("domains", "int_function")(): only Registry.domain
    # gives the domain its registry, and the sandbox comes from there
    domain = propel_registry.domain("int_function", sandbox_options={"memory_mb": 256})
    try:  # the sandbox is made on first use: here, so that a machine without one skips the tests
        domain.sandbox  # noqa: B018
    except Unavailable as exc:  # the sandbox fails closed where an isolation layer is missing
        pytest.skip(f"no sandbox on this machine: {exc}")
    return domain


def test_grades(domain):
    assert domain.grade(TASK, RIGHT).solved is True
    wrong = domain.grade(TASK, WRONG)
    assert wrong.solved is False
    assert wrong.reason == "2 of 4 examples wrong; first: f(-3) = -5, expected 10"


def test_same_verdicts_from_many_threads(domain):
    attempts = [(TASK, RIGHT), (TASK, WRONG), (TASK, "no code at all"), (TASK, "```python\nf = 1 / 0\n```")]
    assert_same_verdicts_concurrently(domain, attempts, threads=4, rounds=1)


def test_a_failing_sandbox_makes_the_attempt_ungradable(propel_register_plugin):
    class BrokenSandbox:
        def __init__(self, **options):
            pass

        def run_python(self, files, main, hash_seed=0, time_limit=None):
            return SimpleNamespace(status="sandbox_error", result=None, stdout="", stderr="bwrap: setting up uid map")

    class Plugin:
        @staticmethod
        @hookimpl
        def register_sandboxes(register):
            register("broken", BrokenSandbox)

    registry = propel_register_plugin(Plugin)
    verdict = registry.domain("int_function", sandbox="broken").grade(TASK, RIGHT)
    assert verdict.solved is None and verdict.reason == "sandbox_error: bwrap: setting up uid map"


def test_sandbox_options_are_checked_against_the_sandbox(propel_registry):
    problems = propel_registry.check_options("domains", "int_function", {"sandbox_options": {"time_limt": 1}})
    assert len(problems) == 1 and "takes no option 'time_limt'" in problems[0] and "'time_limit'" in problems[0]


def test_parses_a_generation(propel_registry):
    domain = propel_registry.domain("int_function")
    payload = domain.parse("Function: f(n) returns n times n plus one\nf(2) = 5\nf(0) = 1\nf(-3) = 10\n")
    assert payload == {"description": "f(n) returns n times n plus one", "examples": [[2, 5], [0, 1], [-3, 10]]}
    with pytest.raises(ParseError, match="two different outputs for f"):
        domain.parse("Function: f(n) returns n\nf(1) = 1\nf(1) = 2\nf(2) = 2\nf(3) = 3")
