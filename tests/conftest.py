"""Shared fixtures: the example third-party plugin, installed for real, and the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE_PLUGIN = Path(__file__).parent / "example_plugin"
EXAMPLE_REWARD_PLUGIN = Path(__file__).parent / "example_reward_plugin"


def pip_install(package: Path, site: Path) -> None:
    """``pip install`` a package of tests/ into the folder ``site``, with no dependencies."""
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
            str(package),
        ],
        check=True,
    )


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
