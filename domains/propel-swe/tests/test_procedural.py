"""The procedural generator's mutations, on source text (no sandbox)."""

import ast
import random

import pytest

from propel_swe.procedural import MUTATIONS, mutate, procedural_bug, sites, source_files

SOURCE = '''\
def pick(items, limit, strict=True):
    """Keep the first items below the limit."""
    if not items:
        return []
    kept = []
    for index in range(len(items) - 1):
        if items[index] < limit and strict:
            kept.append(max(items[index], 0))
    return kept[: limit * 2]
'''


@pytest.mark.parametrize("kind", MUTATIONS)
def test_each_mutation_changes_the_code_and_still_parses(kind):
    found = [site for site in sites("pkg/pick.py", ast.parse(SOURCE)) if site.kind == kind]
    assert found, kind
    mutated = mutate(found[0], SOURCE)
    assert mutated is not None and mutated != SOURCE
    ast.parse(mutated)
    assert mutated.splitlines()[1] == SOURCE.splitlines()[1]  # the docstring line is left as it was


def test_drop_return_branch_removes_the_guard():
    site = next(s for s in sites("p.py", ast.parse(SOURCE)) if s.kind == "drop_return_branch")
    assert "return []" not in mutate(site, SOURCE)


def test_a_bug_is_a_unified_diff_of_one_file():
    description, diff = procedural_bug({"pkg/pick.py": SOURCE}, random.Random(3))
    assert description.split(" at ")[1].startswith("pkg/pick.py:")
    assert diff.startswith("--- a/pkg/pick.py\n+++ b/pkg/pick.py\n@@")
    again = procedural_bug({"pkg/pick.py": SOURCE}, random.Random(3))
    assert again == (description, diff)  # seeded


def test_only_code_under_test_is_mutated():
    assert source_files(["pkg/a.py", "tests/test_a.py", "conftest.py", "setup.py", "README.md"]) == ["pkg/a.py"]
