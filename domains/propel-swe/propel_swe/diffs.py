"""What a bug (or a fix) may change, judged on what applying it did to the checkout, never on how
its headers read: two snapshots (``report.SNAPSHOT``) before and after, compared path by path.

A change may only *modify* existing Python source files of the code under test: the files the suite
imported at preflight (any non-test ``.py`` file when that list is empty). Creating, deleting or
renaming a file, changing a mode or a symbolic link, and touching tests or anything that configures
how tests run or how Python starts are refused. A run of the suite may not change any of those
either, nor any code file.
"""

from __future__ import annotations

from pathlib import PurePosixPath

TEST_DIRS = frozenset({"test", "tests", "testing"})
RUNNER_FILES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py",
     "sitecustomize.py", "usercustomize.py", ".coveragerc", "pytest.py"}
)  # fmt: skip
CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".pth", ".so")


def is_test_path(path: str) -> bool:
    """Tests, and the files that configure how tests run or how Python starts."""
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return (
        any(part in TEST_DIRS for part in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name in RUNNER_FILES
        or name.endswith(".pth")
    )


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


def change_problems(before: dict[str, str], after: dict[str, str], allowed: set[str] | None) -> list[str]:
    """Why the change from snapshot ``before`` to ``after`` is not a plain edit of source files in
    ``allowed`` (None: any non-test ``.py`` file); empty when it is one."""
    problems = []
    for path in changed(before, after):
        old, new = before.get(path), after.get(path)
        if old is None:
            problems.append(f"creates {path}")
        elif new is None:
            problems.append(f"deletes {path}")
        elif old.split()[0] != new.split()[0] or old.startswith(("link", "special")):
            problems.append(f"changes the mode or type of {path}")
        elif is_test_path(path):
            problems.append(f"touches tests or test configuration: {path}")
        elif not path.endswith(".py") or (allowed is not None and path not in allowed):
            problems.append(f"touches {path}, not source code the suite imports")
    return problems


def run_problems(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Tests, test configuration or code that a run of the suite changed, created or deleted."""
    return [f"the code under test changed {path} while the suite ran" for path in changed(before, after)
            if is_test_path(path) or path.endswith(CODE_SUFFIXES)]  # fmt: skip
