"""The ``propel`` command line. Heavy libraries load only inside the verbs that need them."""

from __future__ import annotations

import json
import logging
import os
import sys
from importlib.resources import files
from pathlib import Path

import click

from propel_core.errors import FILE_ERRNOS, PropelError, file_error

DEMO_CONFIG = files("propel_core") / "configs" / "demo.yaml"
#: the figure the demo's built-in config gave when it was measured: the one place it is kept, which
#: the README and docs/experiment.md quote (tests/test_docs.py holds them to it)
DEMO_FIGURE = files("propel_core") / "configs" / "demo_figure.json"


#: the exit status of a command whose stages finished but left attempts ungradable (docs/cli.md);
#: an error is 1 and a command line click cannot parse 2
EXIT_UNGRADABLE = 3


class PropelGroup(click.Group):
    """Turns a PropelError (bad config, unknown name, missing file), a file the run cannot write (full
    disk, read-only mount, no permission) or Ctrl-C into a one-line error, exit 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PropelError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if exc.errno not in FILE_ERRNOS:
                raise
            path = exc.filename or (ctx.obj or {}).get("run_dir") or "a run file"
            raise click.ClickException(str(file_error(path, exc))) from None
        except KeyboardInterrupt:  # the stage's writers closed on the way out: finished records are kept
            raise click.ClickException("interrupted; finished records are kept: rerun the command to go on") from None


@click.group(cls=PropelGroup)
@click.version_option(package_name="propel-core")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or progress messages.")
@click.pass_context
def cli(ctx: click.Context, quiet: bool) -> None:
    """propel: train task generators at the learnable frontier with probe rewards."""
    ctx.obj = {"quiet": quiet}
    for stream in (sys.stdout, sys.stderr):  # a line naming a file or quoting a model never ends the command
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s")
    if quiet:  # read by huggingface_hub and transformers when they are first imported
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    from propel_plugins.vllm_backend import quiet_vllm_logging

    quiet_vllm_logging()  # before TRL or the vllm backend imports vLLM: its logs go to stderr, not stdout


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def plugins(as_json: bool) -> None:
    """List installed plugins, their versions and what each registers."""
    from propel_core.plugins import Registry

    described = Registry.build(PLUGIN_MANAGER).describe()
    if as_json:
        click.echo(json.dumps({"plugins": described}, indent=2))
        return
    for plugin in described:
        click.echo(f"{plugin['name']} {plugin['version'] or ''}".rstrip())
        if "broken" in plugin:
            click.echo(f"  broken, left out: {plugin['broken']}")
        for kind, names in plugin["registers"].items():
            click.echo(f"  {kind.replace('_', ' ')}: {', '.join(names)}")


def start(ctx: click.Context, config: tuple[str, ...] | list[str], overrides: tuple[str, ...] | list[str] = ()):
    """The run a command works in, built as the core's verbs build theirs: the config files merged with
    the overrides, the registry from this invocation's plugin manager, ``-q`` honoured, the run folder
    held until the command ends (another command there is refused), the resolved config saved. Plugin
    commands (``register_commands``) call it with their click context."""
    from propel_core.plugins import Registry
    from propel_core.run import start_run

    run = start_run(list(config), list(overrides), ctx.obj["quiet"], Registry.build(PLUGIN_MANAGER))
    ctx.call_on_close(run.release)  # a process that runs several commands (tests, CliRunner) lets go of each
    ctx.obj["run_dir"] = run.dir  # named by an error writing a file whose path the OS does not give
    return run


def demo_figure_line(config, registry, results: dict) -> str | None:
    """How a demo run's figure (``eval/metrics.json``) compares with the one measured for the built-in
    config (:data:`DEMO_FIGURE`); None when overrides changed anything but ``run_dir``, for then the
    measured figure is about another setting."""
    from propel_core.plans import load_config

    built_in = load_config(str(DEMO_CONFIG), [f"run_dir={config.run_dir}"], registry=registry)
    if config != built_in:
        return None
    try:
        measured = json.loads(DEMO_FIGURE.read_text())
        ours = figure_of(results)
        same = all(f"{ours[key]}" == f"{measured[key]}" for key in ours)
        recorded = (
            f"base {measured['base']} -> trained {measured['trained']}, {measured['shift']} "
            f"[{measured['ci95'][0]}, {measured['ci95'][1]}] ({measured['measured_on']})"
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError):  # an edited install: the run's own figure stands
        return None
    if same:
        return f"This is the figure measured for this config, to the digit: {recorded}; docs/experiment.md#the-demo."
    return (
        f"The figure measured for this config was {recorded}; this run's differs. The promise is for one machine "
        "kind, torch build and thread count: docs/experiment.md#a-run-repeats-from-its-seed."
    )


def figure_of(results: dict) -> dict:
    """A demo evaluation's figure as the README prints it: base and trained utility, the shift and
    its 95% paired interval, rounded to 3 decimals (the shift signed)."""
    shift = results["trained"]["vs_base"]
    return {
        "base": f"{results['base']['utility'][0]:.3f}",
        "trained": f"{results['trained']['utility'][0]:.3f}",
        "shift": f"{shift['mean_difference']:+.3f}",
        "ci95": [f"{value:+.3f}" for value in shift["ci95"]],
    }


def _run_stages(run, names) -> None:
    from propel_core.stages import run_stage

    for name in names:
        logging.getLogger("propel").info("== %s -> %s", name, run.dir)
        run_stage(run, name)


def _exit_status(run) -> None:
    """Exit 3 when a stage finished with ungradable attempts (its line said how many and how to redo
    them), so a script can tell a run to redo from a clean one (0) and a failed one (1)."""
    if run.ungradable:
        click.get_current_context().exit(EXIT_UNGRADABLE)


REDO_UNGRADABLE = click.option(
    "--redo-ungradable",
    is_flag=True,
    help="Run again the solver attempts the labels hold as ungradable (after fixing the grader); "
    "gradable attempts are kept.",
)


def _run_demo_stages(run, names) -> None:
    """Like _run_stages, but a stage left without enough data ends the demo with the reason, not an
    error, and the report is written either way."""
    from propel_core.errors import NotEnoughData
    from propel_core.stages import report

    try:
        _run_stages(run, names)
    except NotEnoughData as exc:
        click.echo(f"\nthe demo stopped: {exc}")
        report(run)


def split_arguments(arguments: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """CONFIG files and key=value OVERRIDES, in the order given; at least one file, each one there.
    A CONFIG that is no file but names a built-in config (``small/countdown``) is that file."""
    from propel_core.plans import config_file

    is_config = [Path(argument).is_file() or "=" not in argument for argument in arguments]
    configs = [argument for argument, config in zip(arguments, is_config, strict=True) if config]
    overrides = [argument for argument, config in zip(arguments, is_config, strict=True) if not config]
    if not configs:
        raise PropelError("name a config file (CONFIG [CONFIG ...] [key=value ...])")
    return [str(config_file(config)) for config in configs], overrides


ARGUMENTS_HELP = "Reads the CONFIG files, merged in order (later ones win), then the key=value OVERRIDES."


@cli.command(context_settings={"ignore_unknown_options": True})
@click.argument("arguments", nargs=-1, metavar="CONFIG... [KEY=VALUE]...")
@REDO_UNGRADABLE
@click.pass_context
def run(ctx: click.Context, arguments: tuple[str, ...], redo_ungradable: bool) -> None:
    """Run every stage in order.

    Reads the CONFIG files, merged in order (later ones win), then the key=value OVERRIDES."""
    from propel_core.stages import STAGES

    started = start(ctx, *split_arguments(arguments))
    started.redo_ungradable = redo_ungradable
    _run_stages(started, STAGES)
    _exit_status(started)


@cli.command("config", context_settings={"ignore_unknown_options": True})
@click.argument("arguments", nargs=-1, metavar="CONFIG... [KEY=VALUE]...")
def print_config(arguments: tuple[str, ...]) -> None:
    """Print the resolved, validated config, then (on stderr) what it will spend; run nothing.

    Reads the CONFIG files, merged in order (later ones win), then the key=value OVERRIDES."""
    from propel_core.config import dump_config
    from propel_core.estimate import estimate, estimate_lines
    from propel_core.plans import load_config, plans_of
    from propel_core.plugins import Registry

    configs, overrides = split_arguments(arguments)
    registry = Registry.build(PLUGIN_MANAGER)
    config = load_config(configs, overrides, registry)
    click.echo(dump_config(config, registry), nl=False)
    # on stderr: stdout stays the config, which reads back and is what RUN/config.yaml keeps
    click.echo("\n".join(estimate_lines(estimate(config, plans_of(config), registry))), err=True)


@cli.command("check", context_settings={"ignore_unknown_options": True})
@click.argument("arguments", nargs=-1, metavar="CONFIG... [KEY=VALUE]...")
@click.option(
    "--samples",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help='A JSONL file of samples: {"generation": ..., "attempts": [...], "valid": bool, "solved": [...]}.',
)
def check_command(arguments: tuple[str, ...], samples: str) -> None:
    """Run the config's domain on a few samples and say every problem, one line each.

    Each sample's generation is parsed, checked by the domain's validity predicates, rendered, and its
    attempts graded, against the "valid" and "solved" the sample expects; then every attempt is graded
    again from 8 threads at once, as the executor does. Loads no model and writes nothing; exits 1 when
    it found a problem."""
    from propel_core.checks import check_domain, read_samples
    from propel_core.plans import load_config
    from propel_core.plugins import Registry

    registry = Registry.build(PLUGIN_MANAGER)
    config = load_config(*split_arguments(arguments), registry)
    domain = registry.domain(config.domain.name, **config.domain.options)
    read = read_samples(Path(samples))
    problems = check_domain(domain, registry.validity_predicates(domain), read, click.echo)
    for line in problems:
        click.echo(f"problem: {line}")
    click.echo(f"{config.domain.name}: {len(problems)} problem(s) in {len(read)} sample(s)")
    if problems:
        click.get_current_context().exit(1)


@cli.command("new-plugin")
@click.argument("folder", type=click.Path(file_okay=False))
@click.option("--name", required=True, help="The plugin's name: the package is propel-NAME, its module propel_NAME.")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    default=("domain",),
    show_default=True,
    help="What it starts with: domain, reward_rule or probe_head (repeat for several).",
)
def new_plugin_command(folder: str, name: str, kinds: tuple[str, ...]) -> None:
    """Write a plugin package to start from into FOLDER, with tests that pass once it is installed.

    Then: pip install -e 'FOLDER[test]' and pytest FOLDER/tests."""
    from propel_core.scaffold import new_plugin

    for path in new_plugin(Path(folder), name, kinds):
        click.echo(f"wrote {path}")
    click.echo(f"next: pip install -e '{folder}[test]' && pytest {folder}/tests")


@cli.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--to", "to", required=True, type=click.Path(), help="The folder the dataset is saved to.")
def export_command(run_dir: str, to: str) -> None:
    """Write RUN_DIR's tasks and labels as a Hugging Face dataset (datasets.load_from_disk reads it).

    One split per task file: corpus (tasks.jsonl) and eval_ARM (eval/ARM/tasks.jsonl), a row per task
    with its label joined in."""
    from propel_core.export import export

    for split, count in export(Path(run_dir), Path(to)).items():
        click.echo(f"{split}: {count} rows")
    click.echo(f"saved to {to}")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--run-dir", default="runs/demo", show_default=True, help="Where the demo run goes.")
@click.argument("overrides", nargs=-1)
@click.pass_context
def demo(ctx: click.Context, run_dir: str, overrides: tuple[str, ...]) -> None:
    """The quick start: the whole pipeline on the embedded model with a small built-in config."""
    from propel_core.stages import STAGES

    with_dir = (f"run_dir={Path(run_dir)}", *overrides)
    run = start(ctx, (str(DEMO_CONFIG),), with_dir)
    _run_demo_stages(run, STAGES)
    table = run.dir / "eval" / "table.md"
    if table.exists():
        from propel_core.evaluation import evaluation_verdict

        click.echo(f"\nbase vs trained, from real solver runs on {run.config.evaluate.num_tasks} tasks per arm:")
        click.echo(table.read_text())
        results = json.loads((run.dir / "eval" / "metrics.json").read_text())
        click.echo(evaluation_verdict(results) + "\n")
        line = demo_figure_line(run.config, run.registry, results) if "trained" in results else None
        if line:
            click.echo(line + "\n")
    click.echo(f"demo finished; the report is {run.dir / 'report.html'}, everything else in {run.dir}/")


#: the stages that label tasks, and so take --redo-ungradable
LABELING = ("label", "evaluate")


def _stage_command(name: str, stage) -> click.Command:
    @click.argument("arguments", nargs=-1, metavar="CONFIG... [KEY=VALUE]...")
    @click.pass_context
    def command(ctx: click.Context, arguments: tuple[str, ...], redo_ungradable: bool = False) -> None:
        run = start(ctx, *split_arguments(arguments))
        run.redo_ungradable = redo_ungradable
        _run_stages(run, [name])
        _exit_status(run)

    command.__doc__ = f"{(stage.__doc__ or '').strip()}\n\n{ARGUMENTS_HELP}"
    if name in LABELING:
        command = REDO_UNGRADABLE(command)
    return click.command(name, context_settings={"ignore_unknown_options": True})(command)


def _add_stage_commands() -> None:
    # stage modules are light (heavy imports happen inside the stages), so --help stays fast
    from propel_core.stages import FOLLOW_UPS, STAGES

    for name, stage in {**STAGES, **FOLLOW_UPS}.items():
        cli.add_command(_stage_command(name, stage))


def add_plugin_commands(manager, group: click.Group) -> None:
    """Each plugin's ``register_commands``, called here (not through pluggy's hook call) with ``group``;
    a plugin whose hook raises is left out (``manager.broken``), and every other plugin's commands work."""
    for impl in manager.hook.register_commands.get_hookimpls():
        try:
            impl.function(**{arg: group for arg in impl.argnames})
        except Exception as exc:
            manager.leave_out(impl.plugin_name, None, exc)


def _plugin_manager():
    """The one plugin manager of this invocation: it adds the plugins' commands now and gives every
    registry the invocation builds."""
    from propel_core.plugins import get_plugin_manager

    manager = get_plugin_manager()
    add_plugin_commands(manager, cli)
    return manager


_add_stage_commands()
PLUGIN_MANAGER = _plugin_manager()


GLOBAL_FLAGS = ("-q", "--quiet")


def global_flags_first(args: list[str]) -> list[str]:
    """``args`` with ``-q``/``--quiet`` moved before the command wherever they were written
    (``propel generate cfg.yaml -q``), unless that command has a ``-q`` of its own."""
    command = cli.commands.get(next((arg for arg in args if not arg.startswith("-")), ""))
    own = {opt for param in (command.params if command else []) for opt in getattr(param, "opts", [])}
    moved = [arg for arg in args if arg in GLOBAL_FLAGS and arg not in own]
    if "--" in args:  # what follows -- is never a flag
        moved = [arg for arg in args[: args.index("--")] if arg in moved]
    rest, taken = [], list(moved)
    for arg in args:
        if arg in taken:
            taken.remove(arg)
        else:
            rest.append(arg)
    return [*moved, *rest]


def main() -> None:
    cli(args=global_flags_first(sys.argv[1:]), prog_name="propel")


if __name__ == "__main__":
    main()
