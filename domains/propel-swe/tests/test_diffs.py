"""Our own diff checks, before anything runs: each kind of diff a bug or a fix must not be."""

import pytest

from propel_swe.diffs import check_diff, is_test_path


def patch(path, old="a = 1", new="a = 2", header=""):
    return f"diff --git a/{path} b/{path}\n{header}--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n"


def test_a_plain_source_change_passes():
    check = check_diff(patch("pkg/core.py"))
    assert check.ok and check.paths == ["pkg/core.py"]


@pytest.mark.parametrize(
    ("diff", "problem"),
    [
        ("", "empty diff"),
        ("just words\n", "not a unified diff"),
        (patch("tests/test_core.py"), "touches tests"),
        (patch("pkg/test_util.py"), "touches tests"),
        (patch("conftest.py"), "touches tests"),
        (patch("pyproject.toml"), "touches tests or test configuration"),
        (patch("setup.cfg"), "touches tests or test configuration"),
        (patch("tox.ini"), "touches tests or test configuration"),
        (patch("pkg/sitecustomize.py"), "touches tests or test configuration"),
        (patch("evil.pth"), "touches tests or test configuration"),
        (patch("../outside.py"), "leaves the repository"),
        (patch(".git/config"), "git metadata"),
        (patch("pkg/core.py", header="old mode 100644\nnew mode 100755\n"), "mode change"),
        (patch("pkg/core.py", header="new file mode 120000\n"), "symlink"),
        (patch("vendor/lib", header="index 1234567..89abcde 160000\n"), "submodule"),
        ("diff --git a/x.bin b/x.bin\nindex 1..2 100644\nGIT binary patch\nliteral 1\n", "binary patch"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "absolute path"),
    ],
)
def test_refused(diff, problem):
    check = check_diff(diff)
    assert not check.ok
    assert problem in check.reason


def test_test_paths():
    assert is_test_path("tests/helpers.py") and is_test_path("src/pkg/foo_test.py")
    assert not is_test_path("src/pkg/testament.py") and not is_test_path("pkg/contest.py")
