"""The layering the code keeps: stages are thin orchestrators over a library that never reaches back.

- no stage imports another stage (what two stages share lives in the library);
- nothing but the command line (which runs them) imports a stage: not the library, not the built-in
  plugins, not a domain;
- the library takes its settings as arguments: only stages (and the run and CLI that start them)
  read ``run.config``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ROOT / "propel_core" / "stages"
#: what starts stages: the command line, and the run it builds for them
STARTERS = {ROOT / "propel_core" / "cli.py", ROOT / "propel_core" / "run.py"}


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (imports inside functions count)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def library_files() -> list[Path]:
    files = [
        path for path in (ROOT / "propel_core").rglob("*.py") if path not in STARTERS and STAGES not in path.parents
    ]
    files += list((ROOT / "plugins").glob("*.py"))
    files += [path for path in (ROOT / "domains").glob("*/propel_*/*.py")]
    return sorted(files)


def test_the_layers_are_where_this_test_looks():
    names = {path.name for path in library_files()}
    assert {"execution.py", "generator.py", "activations.py", "heads.py", "bundles.py", "executors.py"} <= names
    assert len(list(STAGES.glob("*.py"))) >= 10


def test_no_stage_imports_another_stage():
    offenders = []
    for path in STAGES.glob("*.py"):
        if path.name == "__init__.py":  # the table of stages imports each one
            continue
        own = f"propel_core.stages.{path.stem}"
        for module in imported_modules(path):
            if module.startswith("propel_core.stages") and not module.startswith(own):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_nothing_but_the_command_line_imports_a_stage():
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in library_files()
        for module in imported_modules(path)
        if module.startswith("propel_core.stages")
    ]
    assert not offenders, "\n".join(offenders)


def reads_run_config(path: Path) -> list[int]:
    """Lines where ``path`` reads ``run.config`` or ``self.run.config``, outside a plugin's commands
    (``register_commands``), which start runs as the CLI's verbs do."""
    tree = ast.parse(path.read_text())
    commands = [
        node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "register_commands"
    ]
    skipped = {id(inner) for command in commands for inner in ast.walk(command)}
    lines = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Attribute) and node.attr == "config":
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "run") or (
                isinstance(owner, ast.Attribute) and owner.attr == "run"
            ):
                lines.append(node.lineno)
    return lines


def test_the_library_gets_its_settings_as_arguments():
    offenders = [
        f"{path.relative_to(ROOT)}:{line} reads run.config"
        for path in library_files()
        if path.parent.name != "tests"
        for line in reads_run_config(path)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_checks_can_fail(tmp_path):
    stage = tmp_path / "stage.py"
    stage.write_text(
        "def f(run):\n    from propel_core.stages.train import train\n    return run.config.seed\n"
        "def register_commands(cli):\n    return run.config\n"
    )
    assert "propel_core.stages.train" in imported_modules(stage)
    assert reads_run_config(stage) == [3]


def test_the_contracts_depend_on_the_records_alone():
    """contracts.py types what plugins contribute; it imports no module that implements them (not even
    for type checking), so no import cycle runs through it."""
    core = {m for m in imported_modules(ROOT / "propel_core" / "contracts.py") if m.startswith("propel_core")}
    assert {m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in core} <= {"propel_core.records"}


def test_every_public_name_is_the_object_its_module_defines():
    """``from propel_core import X`` is the one import a plugin author needs, for each name of
    ``propel_core.__all__``; it gives the very object of the module that defines it."""
    import importlib

    import pytest

    import propel_core

    assert len(propel_core.__all__) >= 20 and len(set(propel_core.__all__)) == len(propel_core.__all__)
    for module, names in propel_core.PUBLIC.items():
        for name in names:
            assert getattr(propel_core, name) is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="no attribute 'Domian'"):
        propel_core.Domian  # noqa: B018


def core_imports() -> dict[str, set[str]]:
    """propel_core's modules -> the propel_core modules each imports, at any depth (type-checking and
    in-function imports count; ``propel_core`` itself, whose names load lazily, does not)."""
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / "propel_core").rglob("*.py")
    }
    return {
        name: {m for m in imported_modules(path) if m in modules and m not in (name, "propel_core")}
        for name, path in modules.items()
    }


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (its modules in order), or [] when there is none."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_no_import_cycle_in_the_core():
    """No module of propel_core reaches itself through imports, not even through one made only for type
    checking, so each layer can be read (and tested) without the ones above it."""
    graph = core_imports()
    assert {"propel_core.contracts", "propel_core.run", "propel_core.execution"} <= set(graph)
    assert cycle(graph) == [], " -> ".join(cycle(graph))
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check can fail


def test_an_installed_wheel_holds_every_package():
    """pyproject lists packages by hand: a subpackage missing there is missing from a built wheel
    (``propel_core.probes`` was, until a non-editable install on a GPU machine failed to import it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "propel_core").rglob("__init__.py")}
    found |= {"propel_plugins"}
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_a_stage_function_fits_on_a_screen():
    """A stage reads its config, calls the library and writes files: none runs past 80 lines (what
    grows past that is a concept of its own, for the library)."""
    long = []
    for path in STAGES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
