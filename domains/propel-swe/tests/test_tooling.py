"""Ordinary test tooling in a repository's environment: hypothesis's pytest plugin (loaded by its
entry point, it wraps pytest's fixture marker as it loads) leaves every verdict as it is without it."""

import shutil
from pathlib import Path

import pytest
from conftest import DATA, local_domain
from swe_helpers import BUG, fenced, scripted

from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_swe.checkout import git_checkout, python_environment

PROPERTY_TEST = """\
from hypothesis import given, strategies as st

from tinystats.core import clamp


@given(st.integers(-5, 5))
def test_clamp_to_itself(x):
    assert clamp(x, x, x) == x
"""


@pytest.fixture(scope="module")
def hypothesis_domain(tmp_path_factory):
    """The tiny repository with a conftest and a hypothesis test, its suite run in an environment that
    has hypothesis installed (so its pytest plugin loads in both runners)."""
    try:
        env = python_environment(cache_dir() / "swe" / "test-env-hypothesis", ["pytest", "hypothesis"])
    except PropelError as exc:
        pytest.skip(str(exc))
    repo = Path(shutil.copytree(DATA / "tinystats", tmp_path_factory.mktemp("repos") / "tinystats"))
    (repo / "tests" / "conftest.py").write_text("import pytest  # every test now runs under pytest\n")
    (repo / "tests" / "test_properties.py").write_text(PROPERTY_TEST)
    return local_domain("tinystats", git_checkout(repo), env, tmp_path_factory.mktemp("hypothesis"))


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
