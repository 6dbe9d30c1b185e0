"""Shared fixtures: the example third-party plugin, installed for real, and the embedded model; and how
the whole suite (tests/ and domains/) shares a machine when pytest-xdist runs it in several workers
(``make test``: ``-n 2 --dist loadfile --no-loadscope-reorder``, so a test module runs whole on one
worker and builds its module fixtures once, and the longest modules start first).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: the modules that take minutes (measured on a fresh-clone ``make test``, longest first): collected
#: first, and with ``--no-loadscope-reorder`` (``make test``) xdist hands them out first, so no worker
#: is left idle at the end while another still runs one of them
LONGEST_FIRST = (
    "tests/test_vllm_backend.py",
    "tests/test_train.py",
    "tests/test_label.py",
    "domains/propel-mle/tests/test_tasks.py",
    "tests/test_example_plugin.py",
    "domains/propel-mle/tests/test_solve_mle.py",
    "tests/test_execution.py",
    "tests/test_audit.py",
    "tests/test_habits.py",
    "domains/propel-swe/tests/test_real_repos.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))


def pytest_configure(config):
    """Give each xdist worker its own share of the cores (its CPU affinity, which torch, the local
    executor and the sandboxes it starts all read), so two workers never oversubscribe a core with
    torch threads."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker is None or count is None or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    count = int(count)
    index = int(worker.removeprefix("gw")) % count  # a worker restarted after a crash is gw2, gw3, ...
    share = cores[index::count] if count <= len(cores) else [cores[index % len(cores)]]
    os.sched_setaffinity(0, share)


EXAMPLE_PLUGIN = Path(__file__).parent / "example_plugin"
EXAMPLE_REWARD_PLUGIN = Path(__file__).parent / "example_reward_plugin"


def pip_install(package: Path, site: Path) -> None:
    """``pip install`` a package of tests/ into the folder ``site``, with no dependencies; built from a
    copy beside ``site``, so two test workers never build in the source folder at once."""
    import shutil

    copy = site.with_name(f"{site.name}-source")
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(copy),
        ],
        check=True,
    )


@pytest.fixture
def pip_install_into():
    """``pip_install_into(package, site)``: ``pip_install``, for a test that installs a package it made
    (a test module cannot import this conftest by name: the domains' conftests share it)."""
    return pip_install


@pytest.fixture(scope="session")
def example_plugin_site(tmp_path_factory) -> Path:
    """``pip install`` the example domain package into a folder of its own, once per session."""
    site = tmp_path_factory.mktemp("example-site")
    pip_install(EXAMPLE_PLUGIN, site)
    return site


@pytest.fixture(scope="session")
def example_reward_plugin_site(tmp_path_factory) -> Path:
    """``pip install`` the example reward-rule package into a folder of its own, once per session."""
    site = tmp_path_factory.mktemp("example-reward-site")
    pip_install(EXAMPLE_REWARD_PLUGIN, site)
    return site


@pytest.fixture(scope="session")
def example_sandbox_plugin_site(tmp_path_factory) -> Path:
    """``pip install`` the example domain that runs code in the sandbox (tests/example_sandbox_plugin)
    into a folder of its own, once per session; the copy it was built from, with the package's own
    tests/, is beside it (``pip_install``: ``<site>-source``)."""
    site = tmp_path_factory.mktemp("example-sandbox-site")
    pip_install(Path(__file__).parent / "example_sandbox_plugin", site)
    return site


@pytest.fixture
def example_plugin(example_plugin_site, monkeypatch) -> Path:
    """The example plugin visible to this process and to subprocesses, for this test only."""
    monkeypatch.syspath_prepend(str(example_plugin_site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(example_plugin_site), os.environ.get("PYTHONPATH", "")]))
    return example_plugin_site


@pytest.fixture
def example_reward_plugin(example_plugin, example_reward_plugin_site, monkeypatch) -> Path:
    """The example reward-rule package, beside the example domain, for this test only."""
    monkeypatch.syspath_prepend(str(example_reward_plugin_site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(example_reward_plugin_site), os.environ["PYTHONPATH"]]))
    return example_reward_plugin_site


@pytest.fixture(scope="session")
def planted_run():
    """``planted_run(folder)`` writes 128 countdown tasks with a planted label
    (:func:`propel_core.testing.planted_countdown_run`); the probe and train tests learn from it."""
    from propel_core.testing import planted_countdown_run

    return planted_countdown_run


@pytest.fixture(scope="session")
def one_cell_run():
    """``one_cell_run(folder)``: a countdown run in ``folder`` whose probe sweep is one cell (layer 8,
    mean_full, linear)."""
    from propel_core.plans import validate_config
    from propel_core.plugins import Registry
    from propel_core.run import Run

    def make(folder: Path):
        data = {
            "run_dir": str(folder),
            "domain": {"name": "countdown"},
            "probe": {"layers": [8], "poolings": ["mean_full"], "architectures": ["linear"]},
        }
        registry = Registry.build()
        return Run(validate_config(data, registry), registry, quiet=True)

    return make


@pytest.fixture(scope="session")
def planted_probe(tmp_path_factory, planted_run, one_cell_run):
    """A planted run folder with its selected probe (layer 8, mean_full, linear), made once: the
    reward of the train tests' run (which trains in this folder) and of the audit tests' trainings."""
    from propel_core.stages.extract import extract
    from propel_core.stages.probe import probe

    folder = planted_run(tmp_path_factory.mktemp("train-run"))
    run = one_cell_run(folder)
    extract(run)
    probe(run)
    return folder


@pytest.fixture(scope="module")
def azr_reference():
    """AZR (the sandbox's time limit 1 s, its backstop 5 s) and the payload of a valid task, f(xs) =
    max(xs) - min(xs) on ten inputs, checked by its validity (which records the outputs a grader
    compares): where the clock's attack tests grade a hostile answer."""
    from propel_core.plugins import Registry
    from propel_core.records import Task, Validity

    registry = Registry.build()
    if registry.get("sandboxes", "local")().missing_layers():
        pytest.skip("needs bubblewrap and root")
    from propel_azr.plugin import check_execution

    domain = registry.domain("azr", sandbox_options={"time_limit": 1.0, "memory_mb": 256, "backstop": 5})
    code = "def f(xs):\n    return max(xs) - min(xs) if xs else 0\n"
    payload = {"code": code, "inputs": [[[i, i * i % 7, 3]] for i in range(10)], "message": "hint"}
    task = Task(
        id="a", domain="azr", context_id="c", generation="", payload=payload, validity=Validity.ok(), generator="m"
    )
    assert check_execution(task, domain).valid
    return domain, task.payload


@pytest.fixture
def chromium(tmp_path):
    """``chromium(page, *flags)``: headless Chromium (scripts/setup.sh installs it) on the HTML file
    ``page`` with ``flags`` (``--screenshot=PATH``, ``--dump-dom``), its standard output returned; the
    test is skipped where it is not installed. It runs with no profile of the machine's and none of
    Chromium's own network traffic: on a machine with no route out, its lookups and connections at
    start stalled one CI run's screenshot past the limit."""
    import shutil

    if shutil.which("chromium") is None:
        pytest.skip("headless Chromium is not installed (scripts/setup.sh)")

    def run(page: Path, *flags: str) -> str:
        command = [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-quic",
            *flags,
            page.as_uri(),
        ]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120).stdout

    return run
