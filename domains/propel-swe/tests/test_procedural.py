"""The procedural generator's mutations, on source text (no sandbox)."""

import ast

import pytest

from propel_swe.procedural import MUTATIONS, Mutants, mutate, sites, source_files

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
    description, diff = Mutants({"pkg/pick.py": SOURCE}, 3).get(0)
    assert description.split(" at ")[1].startswith("pkg/pick.py:")
    assert diff.startswith("--- a/pkg/pick.py\n+++ b/pkg/pick.py\n@@")
    assert Mutants({"pkg/pick.py": SOURCE}, 3).get(0) == (description, diff)  # seeded


def test_mutants_are_distinct_and_the_same_whatever_is_asked_first():
    files = {"pkg/pick.py": SOURCE, "pkg/other.py": SOURCE.replace("pick", "other")}
    mutants = Mutants(files, 7)
    count = mutants.count()
    diffs = [diff for _, diff in mutants.made]
    assert count == len(set(diffs)) == 14  # 7 sites a file
    backwards = Mutants(files, 7)
    assert [backwards.get(i) for i in reversed(range(count))][::-1] == mutants.made
    assert backwards.get(count) is None  # past the last one: none, never a repeat
    other = Mutants(files, 8)
    assert other.count() == count and other.made != mutants.made and set(other.made) == set(mutants.made)
    first_kinds = {description.split(" at ")[0] for description, _ in mutants.made[:8]}
    assert len(first_kinds) >= 3  # kinds drawn first: argument swaps do not crowd out the rest


def test_only_code_under_test_is_mutated():
    listed = [
        "pkg/a.py",
        "pkg/b.py",
        "tests/test_a.py",
        "conftest.py",
        "setup.py",
        "README.md",
        "docs/conf.py",
        "examples/demo.py",
        "versioneer.py",
        "pkg/_version.py",
        "six.py",
    ]
    assert source_files(listed) == ["pkg/a.py", "pkg/b.py", "pkg/_version.py", "six.py"]
    imported = ["pkg/a.py", "tests/test_a.py", "docs/conf.py", "elsewhere.py"]  # what preflight saw imported
    assert source_files(listed, imported) == ["pkg/a.py", "docs/conf.py"]
