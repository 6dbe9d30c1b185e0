"""Registering a repository as a user would: a PyPI name as written, relative paths, a Python
environment that changes, a suite that cannot start or runs nothing, failing tests named."""

import io
import json
import subprocess
import sys
import tarfile

import pytest
import yaml
from conftest import SANDBOX, local_domain, needs_local_sandbox
from swe_helpers import write_registry

from propel_core.embedded import cache_dir
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_swe.checkout import environment_identity, git_checkout, sdist_checkout
from propel_swe.repos import RepoSpec, load_registry
from propel_swe.verifier import Baseline


def sdist(downloads, filename, top):
    """A source distribution ``filename`` whose one folder is ``top``."""
    with tarfile.open(downloads / filename, "w:gz") as archive:
        data = f"# {top}\n".encode()
        info = tarfile.TarInfo(f"{top}/README.md")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    ("requirement", "top"),
    [
        ("More-Itertools==10.5.0", "more_itertools-10.5.0"),  # PEP 625's underscored archive name
        ("more_itertools==10.5", "more_itertools-10.5.0"),  # 10.5 is 10.5.0
        ("MORE.itertools", "more_itertools-10.5.0"),  # no version: the newest there
        ("More_Itertools==9.1.0", "more-itertools-9.1.0"),  # an older sdist, named as the project is
        ("more-itertools>=9,<10", "more-itertools-9.1.0"),
    ],
)
def test_an_sdist_is_found_whatever_way_the_project_is_written(tmp_path, requirement, top):
    downloads = tmp_path / "sdists"
    downloads.mkdir()
    sdist(downloads, "more_itertools-10.5.0.tar.gz", "more_itertools-10.5.0")
    sdist(downloads, "more-itertools-9.1.0.tar.gz", "more-itertools-9.1.0")
    sdist(downloads, "more_itertools_extra-11.0.tar.gz", "more_itertools_extra-11.0")  # another project
    checkout = sdist_checkout(requirement, downloads, tmp_path / "into")  # found there: nothing downloaded
    assert checkout == tmp_path / "into" / top and (checkout / ".git").is_dir()
    with pytest.raises(PropelError, match="not a requirement"):
        sdist_checkout("more itertools", downloads, tmp_path / "other")


def test_an_sdist_named_otherwise_than_written_is_downloaded_and_checked_out(tmp_path):
    """PyPI serves more-itertools 10.5.0 as ``more_itertools-10.5.0.tar.gz`` (fetched once into
    $PROPEL_CACHE)."""
    downloads = cache_dir() / "swe" / "sdists"
    try:
        checkout = sdist_checkout("More-Itertools==10.5.0", downloads, tmp_path / "into")
    except PropelError as exc:
        if "cannot download" in str(exc):
            pytest.skip(str(exc))
        raise
    assert (checkout / "more_itertools" / "__init__.py").is_file()
    assert sdist_checkout("more_itertools==10.5.0", downloads, tmp_path / "again").name == checkout.name


def test_registry_and_config_paths_are_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "repos" / "r1").mkdir(parents=True)
    (tmp_path / "repos" / "r1" / "x").write_text("1\n")
    git_checkout(tmp_path / "repos" / "r1")
    registry = write_registry(tmp_path / "repos", [{"name": "r1", "path": "r1"}, {"name": "r2", "path": "~/r2"}])
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert [repo.path for repo in load_registry(registry).repos] == [
        tmp_path / "repos" / "r1",
        tmp_path / "home" / "r2",
    ]
    monkeypatch.chdir(tmp_path)
    domain = Registry.build().domain(
        "swe", registry="repos/repos.yaml", preflight_dir="cache", sandbox_options={"python_env": "env"}
    )
    assert domain.sandbox_options["python_env"] == str(tmp_path / "env")
    assert domain.preflight_dir == tmp_path / "cache"


def test_the_cache_key_changes_with_the_time_budget_and_the_environment(tmp_path):
    spec = RepoSpec(name="a", image="i")
    assert spec.key() != RepoSpec(name="a", image="i", time_budget=60).key()
    assert spec.key("env one") != spec.key("env two")
    env = tmp_path / "env"
    site = env / "lib" / "python3.11" / "site-packages"
    (site / "pytest-8.0.0.dist-info").mkdir(parents=True)
    (env / "pyvenv.cfg").write_text("version = 3.11.7\n")
    first = environment_identity(env)
    assert first.startswith(f"{env}#") and environment_identity(tmp_path / "." / "env") == first
    (site / "pytest-8.0.0.dist-info").rename(site / "pytest-8.1.0.dist-info")
    upgraded = environment_identity(env)
    (env / "pyvenv.cfg").write_text("version = 3.12.1\n")
    assert len({first, upgraded, environment_identity(env)}) == 3


def bare_environment(folder):
    """A real virtual environment without pytest (no pip either: quick to make)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder


def test_a_relative_python_env_is_the_folder_it_names(tiny_repo, test_env, tmp_path, monkeypatch):
    """A ``python_env`` relative to the working directory reaches the sandbox as the folder it names."""
    needs_local_sandbox()
    monkeypatch.chdir(test_env.parent)
    domain = local_domain("tinystats", tiny_repo, test_env.name, tmp_path)
    baseline = domain.baseline(domain.repos["tinystats"])
    assert baseline.status == "ok" and baseline.keep, baseline.reasons
    assert [path.name for path in (tmp_path / "preflight").iterdir()] == [f"{baseline.key}.json"]


def test_a_preflight_whose_suite_could_not_start_is_not_cached(tiny_repo, tmp_path):
    """No pytest in the environment: the suite never starts, and the next run tries again."""
    needs_local_sandbox()
    bare = tmp_path / "bare"  # a real virtual environment without pytest (no pip either: quick to make)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    domain = local_domain("tinystats", tiny_repo, bare, tmp_path)
    failed = domain.baseline(domain.repos["tinystats"])
    assert failed.status == "no_report" and not failed.keep
    assert not (tmp_path / "preflight").exists()
    with pytest.raises(PropelError, match=r"no repository passed preflight \(tinystats: status no_report: "):
        domain.contexts()


def repository(folder, tests):
    """A git checkout of the tiny package with ``tests`` (file name -> source) as its suite."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    (folder / "tests").mkdir()
    for name, source in tests.items():
        (folder / "tests" / name).write_text(source)
    return git_checkout(folder)


PASSING = "from pkg import double\n\ndef test_double():\n    assert double(2) == 4\n"
FAILING = "".join(f"def test_wrong_{n}():\n    assert False\n\n" for n in range(5))


def test_a_suite_that_ran_nothing_is_refused_in_one_line():
    collection_error = Baseline(
        repo="r", key="k", status="ok", tests={"tests/test_x.py": "error"}, test_count=1, failures=1
    )
    assert collection_error.reasons == ["the suite ran nothing: no test passed (1 error: tests/test_x.py)"]
    skipped = Baseline(repo="r", key="k", status="ok", tests={"tests/test_x.py::test_a": "skipped"}, test_count=1)
    assert not skipped.keep and skipped.reasons == ["the suite ran nothing: no test passed (1 skipped)"]


def test_preflight_names_the_failing_tests(test_env, tmp_path, propel_cli):
    """``propel swe preflight`` on three repositories: one whose only test file cannot be collected
    (refused: it ran nothing), one with five failing tests (refused, the first three named) and one
    with one (kept, the test named)."""
    needs_local_sandbox()
    broken = repository(tmp_path / "broken", {"test_a.py": "import no_such_module\n\ndef test_a():\n    pass\n"})
    failing = repository(tmp_path / "failing", {"test_a.py": PASSING, "test_b.py": FAILING})
    one = repository(tmp_path / "one", {"test_a.py": PASSING, "test_b.py": "def test_off():\n    assert 1 == 2\n"})
    repos = [{"name": path.name, "path": str(path), "time_budget": 60} for path in (broken, failing, one)]
    config = {
        "run_dir": str(tmp_path / "run"),
        "domain": {
            "name": "swe",
            "options": {
                "registry": str(write_registry(tmp_path, repos)),
                "preflight_dir": str(tmp_path / "preflight"),
                "sandbox_options": {**SANDBOX, "python_env": str(test_env)},
            },
        },
    }
    (tmp_path / "swe.yaml").write_text(yaml.safe_dump(config))
    done = propel_cli("-q", "swe", "preflight", str(tmp_path / "swe.yaml"))
    rows = {row["repo"]: row for row in json.loads((tmp_path / "run" / "swe" / "preflight.json").read_text())}
    assert rows["broken"]["reasons"] == ["the suite ran nothing: no test passed (1 error: tests/test_a.py)"]
    wrong = [f"tests/test_b.py::test_wrong_{n}" for n in range(5)]
    assert rows["failing"]["failing_tests"] == wrong
    assert rows["failing"]["reasons"] == [f"5 baseline failures (at most 1): {', '.join(wrong[:3])} and 2 more"]
    assert rows["one"]["kept"] and rows["one"]["failing_tests"] == ["tests/test_b.py::test_off"]
    assert "no: the suite ran nothing: no test passed (1 error: tests/test_a.py)" in done.stdout
    assert "tests/test_b.py::test_wrong_2 and 2 more" in done.stdout
    assert "failing: tests/test_b.py::test_off" in done.stdout and "kept 1 of 3" in done.stdout
