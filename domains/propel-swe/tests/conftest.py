"""Shared fixtures: the tiny repository written for these tests, and six 1.17.0 from its PyPI sdist."""

import shutil
import signal
from pathlib import Path

import pytest
from swe_helpers import write_registry

from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_swe.checkout import git_checkout, python_environment, sdist_checkout

DATA = Path(__file__).parent / "data"
SIX = "six==1.17.0"


@pytest.fixture
def verdict_deadline():
    """A verdict that hangs (a FIFO the harness would block on, a replay that never answers) fails
    the test instead of the run."""

    def expired(*_):
        raise TimeoutError("the verdict did not come within 300 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(300)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def needs_local_sandbox():
    missing = Registry.build().get("sandboxes", "local")(time_limit=30).missing_layers()
    if missing:
        pytest.skip(f"the local sandbox is missing: {'; '.join(missing)}")


@pytest.fixture(scope="session")
def test_env() -> Path:
    """A virtual environment with pytest only: what the repositories' suites run with."""
    try:
        return python_environment(cache_dir() / "swe" / "test-env", ["pytest"])
    except PropelError as exc:
        pytest.skip(str(exc))


SANDBOX = {"time_limit": 60, "memory_mb": 2048, "max_processes": 64}


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory) -> Path:
    return git_checkout(Path(shutil.copytree(DATA / "tinystats", tmp_path_factory.mktemp("repos") / "tinystats")))


@pytest.fixture(scope="session")
def six_repo(tmp_path_factory) -> Path:
    """six's source distribution, fetched from PyPI once into $PROPEL_CACHE (not committed here)."""
    try:
        return sdist_checkout(SIX, cache_dir() / "swe" / "sdists", tmp_path_factory.mktemp("sdist"))
    except PropelError as exc:
        pytest.skip(str(exc))


def local_domain(name: str, path: Path, test_env: Path, folder: Path, **options):
    """The swe domain on one repository in the local sandbox, its preflight cached in ``folder``."""
    needs_local_sandbox()
    registry = write_registry(folder, [{"name": name, "path": str(path), "time_budget": 120}])
    return Registry.build().domain(
        "swe",
        registry=str(registry),
        preflight_dir=str(folder / "preflight"),
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
        **options,
    )


@pytest.fixture(scope="session")
def tiny_domain(tiny_repo, test_env, tmp_path_factory):
    """The swe domain on the tiny repository, with short turn limits."""
    return local_domain(
        "tinystats", tiny_repo, test_env, tmp_path_factory.mktemp("tiny"), max_turns=6, solver_max_turns=6
    )


@pytest.fixture(scope="session")
def styles_domain(test_env, tmp_path_factory):
    """The swe domain on the test-styles repository (xunit set-ups, unittest, fixtures, parameters)."""
    repo = git_checkout(Path(shutil.copytree(DATA / "teststyles", tmp_path_factory.mktemp("repos") / "teststyles")))
    return local_domain("teststyles", repo, test_env, tmp_path_factory.mktemp("styles"))


@pytest.fixture
def fresh_tiny_domain(tiny_repo, test_env, tmp_path):
    """The swe domain on the tiny repository with no preflight made yet."""
    return local_domain("tinystats", tiny_repo, test_env, tmp_path)


@pytest.fixture(scope="session")
def six_domain(six_repo, test_env, tmp_path_factory):
    """The swe domain on six 1.17.0 (a real project with its own pytest suite), procedural bugs."""
    return local_domain("six", six_repo, test_env, tmp_path_factory.mktemp("six"), generator="procedural")
