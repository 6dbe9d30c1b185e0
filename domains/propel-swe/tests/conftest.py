"""Shared fixtures: the tiny repository written for these tests, and six 1.17.0 from its PyPI sdist."""

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from propel_core.embedded import cache_dir
from propel_core.plugins import Registry

DATA = Path(__file__).parent / "data"
SIX = "six==1.17.0"


def git_checkout(folder: Path) -> Path:
    """Make ``folder`` a git repository with everything committed."""
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "initial"], check=True)
    return folder


def needs_local_sandbox():
    missing = Registry.build().get("sandboxes", "local")(time_limit=30).missing_layers()
    if missing:
        pytest.skip(f"the local sandbox is missing: {'; '.join(missing)}")


@pytest.fixture(scope="session")
def test_env() -> Path:
    """A virtual environment with pytest only: what the repositories' suites run with."""
    env = cache_dir() / "swe" / "test-env"
    if not (env / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        done = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "pytest"], capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot install pytest into a test environment: {done.stderr.strip()[-300:]}")
        (env / ".ready").touch()
    return env


SANDBOX = {"time_limit": 60, "memory_mb": 2048, "max_processes": 64}


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory) -> Path:
    return git_checkout(Path(shutil.copytree(DATA / "tinystats", tmp_path_factory.mktemp("repos") / "tinystats")))


@pytest.fixture(scope="session")
def six_repo(tmp_path_factory) -> Path:
    """six's source distribution, fetched from PyPI once into $PROPEL_CACHE (not committed here)."""
    downloads = cache_dir() / "swe" / "sdists"
    archives = sorted(downloads.glob("six-1.17.0.tar.gz"))
    if not archives:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                               SIX, "-d", str(downloads)], capture_output=True, text=True)  # fmt: skip
        archives = sorted(downloads.glob("six-1.17.0.tar.gz"))
        if done.returncode != 0 or not archives:
            pytest.skip(f"cannot fetch {SIX} from PyPI: {done.stderr.strip()[-300:]}")
    target = tmp_path_factory.mktemp("sdist")
    with tarfile.open(archives[0]) as archive:
        archive.extractall(target, filter="data")
    return git_checkout(target / "six-1.17.0")


def write_registry(folder: Path, repos: list[dict], splits: dict | None = None) -> Path:
    path = folder / "repos.yaml"
    path.write_text(yaml.safe_dump({"repos": repos, "splits": splits or {}}))
    return path


@pytest.fixture(scope="session")
def tiny_domain(tiny_repo, test_env, tmp_path_factory):
    """The swe domain on the tiny repository, in the local sandbox, with short budgets."""
    needs_local_sandbox()
    folder = tmp_path_factory.mktemp("tiny-domain")
    registry = write_registry(folder, [{"name": "tinystats", "path": str(tiny_repo), "time_budget": 60}])
    return Registry.build().domain(
        "swe", registry=str(registry), preflight_dir=str(folder / "preflight"), max_turns=6, solver_max_turns=6,
        sandbox_options={**SANDBOX, "python_env": str(test_env)},
    )  # fmt: skip
