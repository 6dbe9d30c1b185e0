"""A pytest plugin for propel plugin authors, active wherever propel-core is installed.

Fixtures:

- ``plugin_manager``: a fresh plugin manager (installed plugins + built-ins) for this test only.
- ``registry``: the component registry built from that manager.
- ``register_plugin(obj, name=None)``: add a plugin object (a module, class or any object with
  ``@hookimpl`` functions) to the fresh manager and return the rebuilt registry.
- ``propel_cli(*args, check=True)``: run the installed ``propel`` command as a user would and return
  the completed process (``stdout``, ``stderr``, ``returncode``).

Nothing is global: each test gets its own manager, so plugins registered in one test never leak
into another.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from propel_core.plugins import Registry, get_plugin_manager


@pytest.fixture
def plugin_manager():
    return get_plugin_manager()


@pytest.fixture
def registry(plugin_manager):
    return Registry.build(plugin_manager)


@pytest.fixture
def register_plugin(plugin_manager):
    def register(plugin: object, name: str | None = None) -> Registry:
        plugin_manager.register(plugin, name=name)
        return Registry.build(plugin_manager)

    return register


@pytest.fixture
def propel_cli():
    exe = Path(sys.executable).with_name("propel")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(exe), *args], capture_output=True, text=True, check=check)

    return run
