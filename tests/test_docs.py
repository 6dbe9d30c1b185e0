"""Docs and hooks match: every hook has a heading in docs/plugin_hooks.md and a test in test_hooks.py."""

import ast
import inspect
import re
from pathlib import Path

import pytest

from propel_core import hookspecs

ROOT = Path(__file__).parent.parent
HOOKS = [name for name, obj in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("register_")]


def test_hooks_found():
    assert len(HOOKS) == 10


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_documented(hook):
    headings = re.findall(r"^## (\w+)\(", (ROOT / "docs" / "plugin_hooks.md").read_text(), re.MULTILINE)
    assert hook in headings


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook):
    tree = ast.parse((ROOT / "tests" / "test_hooks.py").read_text())
    tests = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert f"test_{hook}" in tests


def test_every_cli_verb_documented():
    from propel_core.cli import cli

    text = (ROOT / "docs" / "cli.md").read_text()
    for verb in cli.commands:
        assert f"## propel {verb}" in text, verb


def test_every_config_section_documented():
    from propel_core.config import PropelConfig

    text = (ROOT / "docs" / "config.md").read_text()
    for section in PropelConfig.model_fields:
        assert f"`{section}`" in text, section
