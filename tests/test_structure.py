"""The layering the code keeps: stages are thin orchestrators over a library that never reaches back.

- no stage imports another stage (what two stages share lives in the library);
- nothing but the command line (which runs them) imports a stage: not the library (nor the run),
  not the built-in plugins, not a domain, not a script; the benchmarks that still do are listed;
- the library takes its settings as arguments: only stages (and the run and CLI that start them)
  read ``run.config``;
- the library never sees the run: it gets ``run.services`` (no config) and does not import
  ``propel_core.run``.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ROOT / "propel_core" / "stages"
#: what starts stages: the command line, and the run it builds for them
STARTERS = {ROOT / "propel_core" / "cli.py", ROOT / "propel_core" / "run.py"}
#: the benchmarks that still run stages (issue 45: a benchmark is to call the library, as a script
#: does); no other may start to, and one that stops leaves this list
BENCHMARKS_ON_STAGES = {
    "audit.py", "audit_evidence.py", "cuda.py", "frontier_shift.py", "label.py", "mle_cost.py", "probe_sweep.py",
    "vllm_label.py", "zero_variance.py",
}  # fmt: skip


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


#: what the repository's own plugins may import from: ``propel_core`` itself (its ``__all__``), and the
#: pytest plugin, which docs/writing_plugins.md ("Test it") names as the module it is
PLUGIN_FACING = ("propel_core", "propel_core.testing")


def plugin_modules() -> list[Path]:
    """The repository's own plugins as they install: the built-ins (``plugins/``) and each domain's
    package (not the domains' tests, which test the core as well)."""
    return sorted([*(ROOT / "plugins").glob("*.py"), *(ROOT / "domains").glob("*/propel_*/**/*.py")])


def library_files() -> list[Path]:
    files = [
        path for path in (ROOT / "propel_core").rglob("*.py") if path not in STARTERS and STAGES not in path.parents
    ]
    return sorted(files + plugin_modules())


def stage_imports(path: Path) -> list[str]:
    return [module for module in imported_modules(path) if module.startswith("propel_core.stages")]


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
    cli = ROOT / "propel_core" / "cli.py"
    shipped = [*library_files(), *(STARTERS - {cli}), *(ROOT / "scripts").glob("*.py")]
    offenders = [f"{path.relative_to(ROOT)} imports {module}" for path in shipped for module in stage_imports(path)]
    benchmarks = {path.name: stage_imports(path) for path in (ROOT / "benchmarks").glob("*.py")}
    offenders += [
        f"benchmarks/{name} imports {', '.join(modules)}: call the library instead, as a script does"
        for name, modules in benchmarks.items()
        if modules and name not in BENCHMARKS_ON_STAGES
    ]
    assert not offenders, "\n".join(offenders)
    stopped = sorted(name for name in BENCHMARKS_ON_STAGES if not benchmarks[name])
    assert not stopped, f"{stopped} no longer import a stage: take them off BENCHMARKS_ON_STAGES"


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


def run_imports(path: Path) -> list[str]:
    return [module for module in imported_modules(path) if module.split(".")[:2] == ["propel_core", "run"]]


def test_the_library_never_sees_the_run():
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}: take Services (run.services) instead"
        for path in library_files()
        for module in run_imports(path)
    ]
    assert not offenders, "\n".join(offenders)


#: the library's entry points, by file, and the plan each takes (propel_core/plans.py)
ENTRY_POINTS = {
    "propel_core/execution.py": {"label_tasks": "LabelPlan", "solver_labels": "LabelPlan", "sample_and_label": "EvaluationPlan"},
    "propel_core/training/generator.py": {"train_generator": "GeneratorPlan"},
    "propel_core/training/solver.py": {"train_solver": "SolverPlan", "fine_tune_solver": "SelfTrainPlan"},
    "propel_core/training/audit.py": {"audit_of": "AuditPlan"},
    "propel_core/probes/sweep.py": {"sweep": "SweepPlan", "save_selected": "SweepPlan"},
}  # fmt: skip


def loose_settings(path: Path, plans: dict[str, str]) -> list[str]:
    """What is wrong with the entry points ``plans`` names in ``path``: one missing, one that takes no
    parameter annotated with its plan, or one that takes a config section beside it."""
    functions = {node.name: node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)}
    problems = []
    for name, plan in plans.items():
        if name not in functions:
            problems.append(f"{path.name}: no function {name}")
            continue
        node = functions[name]
        annotations = [ast.unparse(arg.annotation) for arg in node.args.args if arg.annotation is not None]
        if plan not in annotations:
            problems.append(f"{path.name}: {name} takes no {plan}")
        problems += [f"{path.name}: {name} takes a {a} beside its plan" for a in annotations if a.endswith("Config")]
    return problems


def test_each_entry_point_takes_its_plan_and_no_loose_setting(tmp_path):
    problems = [problem for file, plans in ENTRY_POINTS.items() for problem in loose_settings(ROOT / file, plans)]
    assert not problems, "\n".join(problems)
    loose = tmp_path / "loose.py"
    loose.write_text(
        "def train(services, plan: GeneratorPlan, train_config: TrainConfig): ...\ndef other(seed: int): ...\n"
    )
    assert loose_settings(loose, {"train": "GeneratorPlan", "other": "LabelPlan", "gone": "LabelPlan"}) == [
        "loose.py: train takes a TrainConfig beside its plan", "loose.py: other takes no LabelPlan", "loose.py: no function gone"
    ]  # fmt: skip


def test_the_plans_are_frozen():
    import dataclasses

    from propel_core import plans

    kinds = [value for name, value in vars(plans).items() if name.endswith("Plan") or name == "Plans"]
    assert len(kinds) == 10 and all(
        dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen for kind in kinds
    )


def test_the_checks_can_fail(tmp_path):
    stage = tmp_path / "stage.py"
    stage.write_text(
        "def f(run):\n    from propel_core.stages.train import train\n    return run.config.seed\n"
        "def register_commands(cli):\n    return run.config\n"
        "import propel_core.records\nfrom propel_core import Domain, Domian\nfrom propel_core.run import Run\n"
        "from propel_core.testing import assert_same_verdicts_concurrently\n"
    )
    assert "propel_core.stages.train" in stage_imports(stage)
    assert reads_run_config(stage) == [3]
    assert run_imports(stage) == ["propel_core.run", "propel_core.run.Run"]
    assert sorted(public_face_problems(stage, tmp_path)) == [
        "stage.py:2 imports train from propel_core.stages.train: import from propel_core",
        "stage.py:6 imports propel_core.records: import its names from propel_core",
        "stage.py:7 imports Domian, which propel_core.PUBLIC lacks",
        "stage.py:8 imports Run from propel_core.run: import from propel_core",
    ]


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


def public_face_problems(path: Path, root: Path = ROOT) -> list[str]:
    """Each import in ``path`` (named from ``root``) that goes past propel_core's public face: from a
    module other than ``PLUGIN_FACING``, or of a name that ``propel_core.__all__`` lacks."""
    import propel_core

    problems = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names if alias.name.startswith("propel_core.")]
            problems += [f"{where} imports {module}: import its names from propel_core" for module in modules]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "propel_core":
            names = [alias.name for alias in node.names]
            if node.module not in PLUGIN_FACING:
                problems.append(f"{where} imports {', '.join(names)} from {node.module}: import from propel_core")
            elif node.module == "propel_core":
                lacking = [name for name in names if name not in propel_core.__all__]
                problems += [f"{where} imports {name}, which propel_core.PUBLIC lacks" for name in lacking]
    return problems


def test_the_plugins_import_the_core_from_its_public_face():
    modules = plugin_modules()
    assert {"backends.py", "plugin.py", "domain.py", "environment.py"} <= {path.name for path in modules}
    problems = [problem for path in modules for problem in public_face_problems(path)]
    assert not problems, "\n".join(problems)


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
