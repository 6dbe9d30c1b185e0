"""Diffs in the forms they reach the verifier: a file that is no UTF-8 as an episode diffs it, a patch
of two files as ``diff -u`` writes it, and text no file's bytes read as. Each is answered, and right
work is not refused for its form."""

import difflib
import shutil
from pathlib import Path

import pytest
from conftest import DATA, git_checkout, local_domain
from swe_helpers import BUG

from propel_swe.agent import final_diff
from propel_swe.verifier import workspace

CORE = (DATA / "tinystats" / "tinystats" / "core.py").read_text()
INIT = (DATA / "tinystats" / "tinystats" / "__init__.py").read_text()


def unified(path: str, before: str, after: str) -> str:
    """One file's change as ``diff -u`` and difflib write it: no ``diff --git`` line."""
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))


@pytest.fixture(scope="module")
def latin_domain(test_env, tmp_path_factory):
    """The tiny repository whose core.py has always been Latin-1, a comment in it no UTF-8."""
    folder = tmp_path_factory.mktemp("latin")
    repo = Path(shutil.copytree(DATA / "tinystats", folder / "repos" / "tinystats"))
    text = "# -*- coding: latin-1 -*-\n" + CORE.replace(
        "def clamp(value, low, high):\n", "def clamp(value, low, high):\n    # bornes incluses (r\xe9sultat)\n"
    )
    (repo / "tinystats" / "core.py").write_bytes(text.encode("latin-1"))
    (folder / "domain").mkdir()
    return local_domain("tinystats", git_checkout(repo), test_env, folder / "domain")


def test_a_bug_in_a_latin1_file_as_an_episode_diffs_it_is_valid(latin_domain):
    """Before, the episode's diff was read as text with its Latin-1 byte replaced, so it no longer
    matched the file: a real bug refused as "does not apply"."""
    repo = latin_domain.repos["tinystats"]
    with workspace(latin_domain.sandbox, repo) as ws:
        core = ws.read("tinystats/core.py")
        ws.write("tinystats/core.py", core.replace(b"    if value > high:\n", b"    if value > low:\n"))
        diff = final_diff(ws)
    assert "\udce9" in diff  # the byte 0xe9, carried as the surrogate that writes it back
    validity = latin_domain.verify({"repo": "tinystats", "diff": diff, "turns": ["x"]})
    assert validity.valid, validity.reason


def test_a_patch_of_two_files_without_git_headers_applies(tiny_domain):
    """``git apply --recount`` counted the second file's ``--- a/`` header as a removed line of the
    first file's last hunk; the counts the hunks give are tried first."""
    buggy = CORE.replace("    if value > high:", "    if value > low:")
    touched = INIT.replace("A tiny statistics package", "A tiny package of statistics")
    assert touched != INIT
    diff = unified("tinystats/core.py", CORE, buggy) + unified("tinystats/__init__.py", INIT, touched)
    assert "diff --git" not in diff
    validity = tiny_domain.verify({"repo": "tinystats", "diff": diff, "turns": ["x"]})
    assert validity.valid, validity.reason


def test_text_no_file_reads_as_is_refused_in_one_line(tiny_domain):
    """A lone surrogate no byte decodes to (JSON holds one) made verify raise UnicodeEncodeError."""
    diff = BUG.replace("    if value > low:\n", "    if value > low:  # \ud800\n")
    validity = tiny_domain.verify({"repo": "tinystats", "diff": diff, "turns": ["x"]})
    assert validity.valid is False
    assert "lone surrogates" in validity.reason
