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

from propel_swe.guard import RUNNER_FILES, is_test_path

CODE_SUFFIXES = (".py", ".pyc", ".pyi", ".pth", ".so")
KINDS = ("dir", "link", "special", "unreadable")  # snapshot entries that are not a regular file's


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
        elif _kind(old) != _kind(new) or _kind(old) in KINDS or _kind(new) in KINDS:
            problems.append(f"changes the mode or type of {path}")
        elif is_test_path(path):
            problems.append(f"touches tests or test configuration: {path}")
        elif not path.endswith(".py") or (allowed is not None and path not in allowed):
            problems.append(f"touches {path}, not source code the suite imports")
    return problems


def run_problems(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What a run of the suite left changed that later tests or runs would read: code and runner
    configuration anywhere (created, changed or deleted), existing test files, and anything it made
    unreadable to the snapshot. New data files (in test folders too) are the suite's own business."""
    problems = []
    for path in changed(before, after):
        if after.get(path) == "unreadable":
            problems.append(f"the code under test left {path} unreadable")
        elif "dir" in (_kind(before.get(path)), _kind(after.get(path))):
            continue  # a folder: the files in it are listed on their own
        elif (
            path.endswith(CODE_SUFFIXES)
            or PurePosixPath(path).name in RUNNER_FILES
            or (path in before and is_test_path(path))
        ):
            problems.append(f"the code under test changed {path} while the suite ran")
    return problems


def _kind(entry: str | None) -> str:
    return (entry or "").split(" ", 1)[0]
