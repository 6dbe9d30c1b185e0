"""The verifier on code nobody here wrote, registered with nothing but a name and a path, from PyPI
sdists: a src-layout repository (cachetools 5.5.0: its package under src/, which its tests import), a
flat one (toolz 1.0.0), a src layout with a conftest.py and ``filterwarnings = error`` (markupsafe
3.0.2) and a unittest suite (idna 3.10). Procedural bugs verify, each exact revert solves, a change
that does nothing and a README edit do not, and the revert written in every ordinary shape of fix
(``verdicts.FIX_SHAPES``) solves (``propel_swe.verdicts.survey``). ``benchmarks/swe_repos.py``
surveys more bugs of five such repositories (docs/swe.md)."""

import pytest
from conftest import local_domain

from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_swe.checkout import sdist_checkout
from propel_swe.verdicts import FIX_SHAPES, survey

BUGS = 3
#: requirement -> the fewest tests its suite collects (pytest alone in the tests' environment)
REPOS = {"cachetools==5.5.0": 100, "toolz==1.0.0": 100, "markupsafe==3.0.2": 70, "idna==3.10": 30}


@pytest.mark.parametrize("requirement", list(REPOS))
def test_bugs_and_fixes_of_a_real_repository_are_judged_for_what_they_do(requirement, test_env, tmp_path):
    name = requirement.split("==")[0]
    try:
        repo = sdist_checkout(requirement, cache_dir() / "swe" / "sdists", tmp_path / "sdist")
    except PropelError as exc:
        pytest.skip(str(exc))
    domain = local_domain(name, repo, test_env, tmp_path, generator="procedural")
    baseline = domain.baseline(domain.repos[name])
    assert baseline.keep and baseline.test_count >= REPOS[requirement], baseline.reasons
    found = survey(domain, name, BUGS)
    refused = [(row["bug"], row["reason"]) for row in found["rows"] if not row["valid"]]
    assert found["valid"] >= BUGS - 1, refused
    assert found["reverts_solved"] == found["valid"], found["rows"]
    assert found["no_ops_solved"] == 0 and found["readme_edits_solved"] == 0
    assert found["shapes_solved"] == dict.fromkeys(FIX_SHAPES, 1), found["rows"][0]
    assert found["replayed"] >= 1, found["rows"]  # a fix of at least one is judged outside the tests too


def test_an_sdist_whose_build_backend_has_no_pure_python_sdist_is_checked_out(tmp_path):
    """bidict 0.24.1 builds with uv_build, whose own sdist needs Rust crates to build: only the
    project is fetched from source, its build backend as a wheel (before, every uv_build project
    failed to download)."""
    downloads = tmp_path / "sdists"  # not the shared cache: the download itself is what is tested
    try:
        checkout = sdist_checkout("bidict==0.24.1", downloads, tmp_path / "into")
    except PropelError as exc:
        if "No matching distribution" in str(exc) or "Could not find a version" in str(exc):
            pytest.skip(str(exc))  # PyPI cannot be reached
        raise
    assert (checkout / "bidict" / "__init__.py").is_file() and (checkout / ".git").is_dir()
