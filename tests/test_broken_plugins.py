"""A broken third-party plugin costs one line, not the command line: one that fails to import and one
whose register hook raises, installed beside the core (dist-info and entry points, as pip leaves them)."""

import os

import pytest

from propel_core.plugins import Registry, get_plugin_manager

PLUGINS = {
    # entry point -> (module source, distribution)
    "broken_import": ("raise ImportError('this plugin needs numpy 9')\n", "propel-broken-import"),
    "broken_register": (
        "from propel_core import hookimpl\n\n\n@hookimpl\ndef register_domains(register):\n"
        "    register('halfway', object)\n    raise RuntimeError('the registry changed under me')\n",
        "propel-broken-register",
    ),
}


@pytest.fixture
def broken_plugins(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for entry, (source, distribution) in PLUGINS.items():
        module = f"propel_test_{entry}"
        (site / f"{module}.py").parent.mkdir(parents=True, exist_ok=True)
        (site / f"{module}.py").write_text(source)
        info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[propel]\n{entry} = {module}\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PROPEL_LOAD_PLUGINS", raising=False)
    return site


def test_the_registry_leaves_broken_plugins_out(broken_plugins):
    registry = Registry.build(get_plugin_manager())
    broken = {plugin.name: plugin for plugin in registry.broken}
    assert set(broken) == {"broken_import", "broken_register"}
    assert broken["broken_import"].error == "ImportError: this plugin needs numpy 9"
    assert broken["broken_register"].distribution == "propel-broken-register"
    assert "halfway" not in registry.names("domains") and "arithmetic" in registry.names("domains")


def test_the_command_line_still_works_and_says_why_in_one_line(broken_plugins, propel_cli, tmp_path):
    version = propel_cli("--version")
    assert version.stdout.startswith("propel, version")
    warnings = version.stderr.strip().splitlines()
    assert len(warnings) == 1 and "plugin 'broken_import' (distribution propel-broken-import)" in warnings[0]
    assert "pip uninstall propel-broken-import" in warnings[0] and "PROPEL_LOAD_PLUGINS" in warnings[0]

    listed = propel_cli("plugins").stdout
    assert "broken_import 1.0\n  broken, left out: ImportError: this plugin needs numpy 9" in listed
    assert "broken, left out: RuntimeError: the registry changed under me" in listed
    assert "propel_plugins.backends" in listed

    config = tmp_path / "c.yaml"
    config.write_text("domain:\n  name: halfway\n")
    failed = propel_cli("config", str(config), check=False)
    assert failed.returncode != 0
    named = [line for line in failed.stderr.splitlines() if "unknown domain 'halfway'" in line]
    assert len(named) == 1 and "plugin 'broken_register'" in named[0], failed.stderr  # where it would have come from
    assert "Traceback" not in failed.stderr


def test_leaving_them_out_by_name_silences_them(broken_plugins, propel_cli, monkeypatch):
    monkeypatch.setenv("PROPEL_LOAD_PLUGINS", "")
    quiet = propel_cli("--version")
    assert quiet.stderr == "" and quiet.stdout.startswith("propel, version")
