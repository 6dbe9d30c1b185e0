"""Docs match the code: docs/plugin_hooks.md is what scripts/hook_docs.py renders from the hook specs,
every hook has a test in test_hooks.py, every CLI verb and config section is documented, docs/config.md's
examples are configs propel accepts, and the README's layout table and domain list name what the
repository holds."""

import ast
import importlib.util
import inspect
import re
from pathlib import Path

import pluggy
import pytest

from propel_core import hookspecs

ROOT = Path(__file__).parent.parent
_spec = importlib.util.spec_from_file_location("hook_docs", ROOT / "scripts" / "hook_docs.py")
hook_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hook_docs)
HOOKS = [hook.__name__ for hook in hook_docs.hooks()]


def test_hooks_found():
    """The generator documents exactly the hooks pluggy reads from hookspecs.py."""
    pm = pluggy.PluginManager("propel")
    pm.add_hookspecs(hookspecs)
    assert HOOKS and set(HOOKS) == set(vars(pm.hook))


def test_plugin_hooks_page_is_generated():
    page = (ROOT / "docs" / "plugin_hooks.md").read_text()
    assert page == hook_docs.render(), (
        f"docs/plugin_hooks.md is out of date with propel_core/hookspecs.py; run `{hook_docs.COMMAND}`"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_signature_documented(hook):
    signature = f"{hook}{inspect.signature(getattr(hookspecs, hook))}"
    assert f"\n## {signature}\n" in (ROOT / "docs" / "plugin_hooks.md").read_text()


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


def _readme_layout() -> dict[str, str]:
    """The README's "## Layout" table: first column (the path, without backticks) -> second column."""
    section = (ROOT / "README.md").read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return {cells[0].strip().strip("`"): cells[1].strip() for cells in rows[2:]}  # after header, rule


def test_readme_layout_paths_exist():
    layout = _readme_layout()
    assert layout, "README.md has no Layout table"
    missing = [path for path in layout if not (ROOT / path).exists()]
    assert not missing, f"README.md's Layout names paths the repository does not have: {missing}"


def test_readme_names_every_domain(monkeypatch):
    """The domain packages under domains/, the README's Layout row for them, the domains they register
    and the README intro's list of domains all agree."""
    import tomllib

    from propel_core.plugins import Registry

    packages = {}  # distribution name -> its propel entry-point names
    for pyproject in sorted((ROOT / "domains").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["name"] == pyproject.parent.name, f"{pyproject}: the package is named after its folder"
        packages[project["name"]] = set(project.get("entry-points", {}).get("propel", {}))
    assert packages
    assert set(re.findall(r"`([\w-]+)`", _readme_layout()["domains/"])) == set(packages)

    monkeypatch.delenv("PROPEL_LOAD_PLUGINS", raising=False)
    components = Registry.build().components["domains"]
    registered = {
        package: {name for name, component in components.items() if component.plugin in entry_points}
        for package, entry_points in packages.items()
    }
    assert all(registered.values()), f"a package under domains/ registers no domain: {registered}"
    domains = set().union(*registered.values())

    intro = " ".join((ROOT / "README.md").read_text().split("\n## ", 1)[0].split())
    count, listed = re.search(r"(\w+) domains \(([^)]*)\)", intro).groups()
    named = {item.split()[0].lower() for item in listed.split(", ")}
    numbers = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    assert named == domains and numbers.index(count) == len(domains), (
        f"README says {count} domains ({listed}); the packages under domains/ register {sorted(domains)}"
    )


def test_config_doc_quotes_the_real_errors(propel_registry):
    from propel_core.config import ConfigError
    from propel_core.plans import validate_config

    text = " ".join((ROOT / "docs" / "config.md").read_text().split())
    with pytest.raises(ConfigError) as err:
        validate_config({"domain": {"name": "countdown"}, "train": {"loss_type": "ppo"}}, propel_registry)
    (quoted,) = [line.strip("- ") for line in str(err.value).splitlines() if "loss_type" in line]
    assert f"`{quoted}`" in text


def test_config_doc_examples_are_configs_propel_accepts(propel_registry):
    """Each YAML example of docs/config.md reads as propel config reads it: the first, the smallest
    config, alone, and each later one (a section) merged over it."""
    import yaml

    from propel_core.plans import validate_config

    text = (ROOT / "docs" / "config.md").read_text()
    smallest, *sections = [yaml.safe_load(block) for block in re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)]
    assert smallest == {"domain": {"name": "countdown"}} and sections
    for example in [{}, *sections]:
        validate_config({**smallest, **example}, propel_registry)


def test_cli_doc_names_the_demo_domain():
    import yaml

    demo = yaml.safe_load((ROOT / "propel_core" / "configs" / "demo.yaml").read_text())
    section = (ROOT / "docs" / "cli.md").read_text().split("## propel demo\n", 1)[1].split("\n## ", 1)[0]
    assert f"the {demo['domain']['name']} domain" in " ".join(section.split())


def test_library_doc_runs_a_stage_from_python(tmp_path, monkeypatch, capsys):
    """The "Running a stage from Python" block of docs/library.md, run as written from a folder that is
    not the checkout (the built-in config it names is found by name), writes and reads back what it says."""
    section = (ROOT / "docs" / "library.md").read_text().split("### Running a stage from Python\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # the section's first block
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/library.md", "exec"), {})
    from propel_core.records import Task, iter_jsonl

    tasks = list(iter_jsonl(tmp_path / "runs" / "from-python" / "tasks.jsonl", Task))
    assert len(tasks) == 4 and (tmp_path / "runs" / "from-python" / "config.yaml").exists()
    out = capsys.readouterr().out
    assert "generated 4 -> parsed" in out
    assert f"4 tasks, {sum(t.validity.valid for t in tasks)} valid; first: " in out


def test_the_demo_figure_is_quoted_from_its_one_source():
    """The README and docs/experiment.md quote the figure the demo's config gave, as
    propel_core/configs/demo_figure.json keeps it (and `propel demo` reads it); none of them repeats
    the 3-seed experiment's figures, which docs/experiment.md alone keeps."""
    import json

    figure = json.loads((ROOT / "propel_core" / "configs" / "demo_figure.json").read_text())
    low, high = figure["ci95"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    experiment = " ".join((ROOT / "docs" / "experiment.md").read_text().split())
    shift = f"{figure['base']} -> {figure['trained']}, a shift of {figure['shift']} with a 95%"
    assert f"{shift} interval of [{low}, {high}]" in readme
    assert f"{shift} paired bootstrap interval of [{low}, {high}] over {figure['contexts']} contexts" in experiment
    assert f"{figure['minutes']} minutes" in experiment
    for repeated in ("0.172", "0.348"):  # the experiment's headline figures: docs/experiment.md only
        assert repeated not in readme and repeated not in (ROOT / "benchmarks" / "README.md").read_text()
