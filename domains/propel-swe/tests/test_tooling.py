"""Ordinary test tooling: hypothesis's pytest plugin in a repository's environment (loaded by its entry
point, it wraps pytest's fixture marker as it loads) and a unittest suite whose tests a metaclass
generates leave every verdict as it would be without them."""

import shutil
from pathlib import Path

import pytest
from conftest import DATA, local_domain
from swe_helpers import BUG, fenced, scripted

from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_swe.checkout import git_checkout, python_environment
from propel_swe.verifier import second_run, workspace

PROPERTY_TEST = """\
from hypothesis import given, strategies as st

from tinystats.core import clamp


@given(st.integers(-5, 5))
def test_clamp_to_itself(x):
    assert clamp(x, x, x) == x
"""


@pytest.fixture(scope="module")
def hypothesis_env() -> Path:
    """An environment with pytest and hypothesis (whose pytest plugin loads in both runners)."""
    try:
        return python_environment(cache_dir() / "swe" / "test-env-hypothesis", ["pytest", "hypothesis"])
    except PropelError as exc:
        pytest.skip(str(exc))


def with_hypothesis(folder: Path, env: Path, config: str = ""):
    """The swe domain on the tiny repository with a conftest and a hypothesis test, its suite run in
    ``env``; ``config``: the text of a ``pytest.ini`` it gets."""
    repo = Path(shutil.copytree(DATA / "tinystats", folder / "repos" / "tinystats"))
    (repo / "tests" / "conftest.py").write_text("import pytest  # every test now runs under pytest\n")
    (repo / "tests" / "test_properties.py").write_text(PROPERTY_TEST)
    if config:
        (repo / "pytest.ini").write_text(config)
    (folder / "domain").mkdir()
    return local_domain("tinystats", git_checkout(repo), env, folder / "domain")


@pytest.fixture(scope="module")
def hypothesis_domain(hypothesis_env, tmp_path_factory):
    return with_hypothesis(tmp_path_factory.mktemp("hypothesis"), hypothesis_env)


def test_a_bug_is_valid_and_its_revert_solves_it_with_hypothesis_in_the_environment(hypothesis_domain):
    domain = hypothesis_domain
    baseline = domain.baseline(domain.repos["tinystats"])
    assert baseline.status == "ok" and baseline.test_count == 8 and baseline.failures == 0
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    validity = domain.verify(payload)
    assert validity.valid, validity.reason  # before: "tampered; the runners disagree"
    payload["turns"] = []
    revert = fenced(
        "edit", "tinystats/core.py\n<<<<<<< SEARCH\n    if value > low:\n=======\n    if value > high:\n>>>>>>> REPLACE"
    )
    fixed = domain.grade(payload, domain.solver_episode(payload, scripted(revert, fenced("submit"))))
    assert fixed.solved is True, fixed.reason
    nothing = domain.grade(payload, domain.solver_episode(payload, scripted(fenced("submit"))))
    assert nothing.solved is False


def test_the_second_runner_judges_a_clean_checkout_as_pytest_does_under_filterwarnings_error(hypothesis_env, tmp_path):
    """The second runner imports the environment's plugins before ``pytest.main``, and pytest warns that
    it cannot rewrite them; a repository's ``filterwarnings = error`` made that warning an internal
    error, so every test run under pytest there was an ``error`` on the clean checkout too (blinker)."""
    domain = with_hypothesis(tmp_path, hypothesis_env, "[pytest]\nfilterwarnings = error\n")
    repo = domain.repos["tinystats"]
    baseline = domain.baseline(repo)
    assert baseline.status == "ok" and baseline.test_count == 8 and baseline.failures == 0
    with workspace(domain.sandbox, repo) as ws:
        assert second_run(ws, repo, sorted(baseline.tests), 60) == baseline.tests  # before: each an error


GENERATED = """\
import unittest

from gen.core import double, half


class Generated(type):
    def __new__(mcs, name, bases, namespace):
        for i in range(4):
            namespace[f"test_double_{i}"] = lambda self, i=i: self.assertEqual(double(i), 2 * i)
        return super().__new__(mcs, name, bases, namespace)


class TestDouble(unittest.TestCase, metaclass=Generated):
    def test_half(self):
        self.assertEqual(half(4), 2)
"""
DOUBLING_BUG = "".join(  # a diff's blank context lines are a single space
    line + "\n"
    for line in (
        "--- a/gen/core.py", "+++ b/gen/core.py", "@@ -1,5 +1,5 @@", " def double(x):", "-    return 2 * x",
        "+    return 2 * x + 1", " ", " ", " def half(x):",
    )
)  # fmt: skip


def test_a_bug_in_generated_unittest_tests_is_valid_and_its_revert_solves_it(test_env, tmp_path):
    """Tests a metaclass sets as lambdas are reached by their node id's name (their functions are all
    named ``<lambda>``): the second runner runs each (before, each was an error and the bug refused),
    and grading runs the first three failing tests alone under it, as verification did."""
    repo = tmp_path / "gen"
    (repo / "gen").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "gen" / "__init__.py").write_text("")
    (repo / "gen" / "core.py").write_text("def double(x):\n    return 2 * x\n\n\ndef half(x):\n    return x / 2\n")
    (repo / "tests" / "__init__.py").write_text("")
    (repo / "tests" / "test_gen.py").write_text(GENERATED)
    (tmp_path / "domain").mkdir()
    domain = local_domain("gen", git_checkout(repo), test_env, tmp_path / "domain")
    payload = {"repo": "gen", "diff": DOUBLING_BUG, "turns": ["x"]}
    validity = domain.verify(payload)
    assert validity.valid, validity.reason
    assert payload["failing_tests"] == [f"tests/test_gen.py::TestDouble::test_double_{i}" for i in range(4)]
    payload["turns"] = []
    revert = fenced(
        "edit", "gen/core.py\n<<<<<<< SEARCH\n    return 2 * x + 1\n=======\n    return 2 * x\n>>>>>>> REPLACE"
    )
    fixed = domain.grade(payload, domain.solver_episode(payload, scripted(revert, fenced("submit"))))
    assert fixed.solved is True, fixed.reason
    assert fixed.diagnostics["judged_by"]["second_runner"] == payload["failing_tests"][:3]
