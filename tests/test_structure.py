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
    files = [path for path in (ROOT / "propel_core").glob("*.py") if path not in STARTERS]
    files += list((ROOT / "plugins").glob("*.py"))
    files += [path for path in (ROOT / "domains").glob("*/propel_*/*.py")]
    return sorted(files)


def test_the_layers_are_where_this_test_looks():
    names = {path.name for path in library_files()}
    assert {"execution.py", "training.py", "activations.py", "probes.py", "executors.py"} <= names
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
