"""The rules for what a change may touch, on snapshots (path -> "MODE HASH"); the hostile diffs that
reach them through git are in test_hostile.py."""

import pytest

from propel_swe.diffs import change_problems, is_test_path, run_problems

CLEAN = {"pkg/core.py": "644 a", "pkg/util.py": "644 b", "README": "644 c", "tests/test_x.py": "644 d"}


def test_a_plain_source_edit_passes():
    assert change_problems(CLEAN, {**CLEAN, "pkg/core.py": "644 z"}, {"pkg/core.py"}) == []
    assert change_problems(CLEAN, {**CLEAN, "pkg/util.py": "644 z"}, None) == []


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        ({**CLEAN, "conftest.py": "644 e"}, "creates conftest.py"),
        ({k: v for k, v in CLEAN.items() if k != "pkg/core.py"}, "deletes pkg/core.py"),
        ({**CLEAN, "pkg/core.py": "755 a"}, "changes the mode or type of pkg/core.py"),
        ({**CLEAN, "pkg/core.py": "link ../tests/test_x.py"}, "changes the mode or type of pkg/core.py"),
        ({**CLEAN, "tests/test_x.py": "644 z"}, "touches tests or test configuration: tests/test_x.py"),
        ({**CLEAN, "README": "644 z"}, "touches README, not source code the suite imports"),
        ({**CLEAN, "pkg/util.py": "644 z"}, "touches pkg/util.py, not source code the suite imports"),
    ],
)
def test_refused(after, problem):
    assert problem in change_problems(CLEAN, after, {"pkg/core.py"})


def test_what_a_run_may_not_change():
    assert run_problems(CLEAN, {**CLEAN, "out.txt": "644 e", "README": "644 f"}) == []
    for path in ("pkg/__pycache__/core.cpython-312.pyc", "tests/conftest.py", "pkg/core.py", "x.pth", ".pytest.ini"):
        assert run_problems(CLEAN, {**CLEAN, path: "644 e"}) == [
            f"the code under test changed {path} while the suite ran"
        ]


def test_test_paths():
    assert is_test_path("tests/helpers.py") and is_test_path("src/pkg/foo_test.py") and is_test_path(".pytest.ini")
    assert not is_test_path("src/pkg/testament.py") and not is_test_path("pkg/contest.py")
