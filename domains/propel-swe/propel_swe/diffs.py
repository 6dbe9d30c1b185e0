"""Our own checks of a diff before anything runs, and which paths count as tests.

A bug (or a fix) may only change the code under test. Everything that could change what the test
suite checks, how it runs, or what the interpreter does at start-up is refused, as is anything that
could reach outside the repository: ``..``, absolute paths, ``.git/``, symlinks, submodules, binary
patches and mode changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

TEST_DIRS = frozenset({"test", "tests", "testing"})
RUNNER_FILES = frozenset(
    {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py", "sitecustomize.py",
     "usercustomize.py", ".coveragerc"}
)  # fmt: skip
SPECIAL_MODES = {"120000": "a symlink", "160000": "a submodule"}


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


@dataclass
class DiffCheck:
    paths: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def reason(self) -> str | None:
        return "; ".join(self.problems) or None


HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def check_diff(diff: str) -> DiffCheck:
    """Every changed path and every problem with the diff (none: it may be applied)."""
    result = DiffCheck()
    if not diff.strip():
        result.problems.append("empty diff: nothing changed")
        return result
    paths: list[str] = []
    for line in diff.splitlines():
        if match := HEADER.match(line):
            paths += match.groups()
        elif line.startswith(("--- ", "+++ ")):
            target = line[4:].split("\t")[0].strip()
            if target != "/dev/null":
                paths.append(_strip_prefix(target))
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.append(line.split(" ", 2)[2].strip())
        elif line.startswith(("old mode ", "new mode ")):
            result.problems.append("mode change")
        elif line.startswith(("new file mode ", "deleted file mode ")):
            mode = line.rsplit(" ", 1)[1]
            if mode in SPECIAL_MODES:
                result.problems.append(f"adds or removes {SPECIAL_MODES[mode]}")
            elif mode != "100644":
                result.problems.append(f"file mode {mode}")
        elif line.startswith("index ") and line.rsplit(" ", 1)[-1] in SPECIAL_MODES:
            result.problems.append(f"changes {SPECIAL_MODES[line.rsplit(' ', 1)[-1]]}")
        elif line.startswith(("GIT binary patch", "Binary files ")):
            result.problems.append("binary patch")
    result.paths = list(dict.fromkeys(paths))
    if not result.paths:
        result.problems.append("no file headers: not a unified diff")
    for path in result.paths:
        parts = PurePosixPath(path).parts
        if path.startswith("/"):
            result.problems.append(f"absolute path {path}")
        elif ".." in parts:
            result.problems.append(f"path leaves the repository: {path}")
        elif ".git" in parts:
            result.problems.append(f"touches git metadata: {path}")
        elif is_test_path(path):
            result.problems.append(f"touches tests or test configuration: {path}")
    result.problems = list(dict.fromkeys(result.problems))
    return result


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path
