"""Shared fixtures: the example third-party plugin, installed for real, and the embedded model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE_PLUGIN = Path(__file__).parent / "example_plugin"


@pytest.fixture(scope="session")
def example_plugin_site(tmp_path_factory) -> Path:
    """``pip install`` the example domain package into a folder of its own, once per session."""
    site = tmp_path_factory.mktemp("example-site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(site), str(EXAMPLE_PLUGIN)],
        check=True,
    )  # fmt: skip
    return site


@pytest.fixture
def example_plugin(example_plugin_site, monkeypatch) -> Path:
    """The example plugin visible to this process and to subprocesses, for this test only."""
    monkeypatch.syspath_prepend(str(example_plugin_site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(example_plugin_site), os.environ.get("PYTHONPATH", "")]))
    return example_plugin_site


@pytest.fixture(scope="session")
def embedded_backend():
    """The transformers backend on the embedded default model, loaded once per session."""
    from propel_core.config import ModelConfig
    from propel_plugins.backends import TransformersBackend

    return TransformersBackend(ModelConfig(batch_size=4))
