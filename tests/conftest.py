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
    """``planted_run(folder)`` writes 128 valid countdown tasks (the domain's own example puzzles) and
    labels with a planted signal: a task is 'in band' when its target is above the median, a property
    the reference model can read. The probe and train tests learn from it."""
    import statistics

    from propel_core.domain import make_task
    from propel_core.plugins import Registry
    from propel_core.records import JsonlWriter, Label, SolverAttempt

    def write(folder: Path) -> Path:
        registry = Registry.build()
        domain = registry.domain("countdown")
        predicates = registry.validity_predicates(domain)
        puzzles = [example for context in domain.contexts() for example in context.data["examples"]]
        median = statistics.median(p["target"] for p in puzzles)
        with JsonlWriter(folder / "tasks.jsonl") as tasks, JsonlWriter(folder / "labels.jsonl") as labels:
            for i, puzzle in enumerate(puzzles):
                text = domain.render(puzzle)
                task = make_task(f"t{i:03d}", domain, domain.contexts()[i // 2], text, "m", predicates)
                tasks.write(task)
                solved = 2 if puzzle["target"] > median else 0
                attempts = [SolverAttempt(text="", solved=j < solved) for j in range(8)]
                labels.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))
        return folder

    return write
