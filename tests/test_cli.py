"""The propel console script, run as a user runs it."""

import json

import pytest


def test_help_lists_verbs(propel_cli):
    out = propel_cli("--help").stdout
    for verb in ("plugins", "run", "demo", "generate"):
        assert f"  {verb} " in out


def test_the_demo_compares_its_figure_with_the_measured_one_only_on_the_built_in_config(propel_registry):
    from propel_core.cli import DEMO_CONFIG, DEMO_FIGURE, demo_figure_line
    from propel_core.plans import load_config

    measured = json.loads(DEMO_FIGURE.read_text())

    def results(base, trained, shift, low, high):
        return {
            "base": {"utility": [base, 0.0]},
            "trained": {"utility": [trained, 0.0], "vs_base": {"mean_difference": shift, "ci95": [low, high]}},
        }

    same = results(*(float(measured[key]) for key in ("base", "trained", "shift")), *map(float, measured["ci95"]))
    config = load_config(str(DEMO_CONFIG), ["run_dir=elsewhere"], registry=propel_registry)
    assert "This is the figure measured for this config, to the digit" in demo_figure_line(
        config, propel_registry, same
    )
    other = results(0.5, 0.25, -0.25, -0.3, -0.2)
    assert "this run's differs" in demo_figure_line(config, propel_registry, other)
    for override in ("label.k=8", "solver.sampling.temperature=1.0", "domain.name=countdown", "train.steps=3"):
        changed = load_config(str(DEMO_CONFIG), [override], registry=propel_registry)
        assert demo_figure_line(changed, propel_registry, same) is None, override


def test_plugins_json(propel_cli):
    plugins = {p["name"]: p for p in json.loads(propel_cli("plugins", "--json").stdout)["plugins"]}
    assert plugins["propel_plugins.rewards"]["registers"]["reward_rules"] == [
        "adversarial",
        "hard",
        "partial_instrumentation",
        "probe_only",
        "soft",
        "solver_in_the_loop",
        "wco",
    ]
    assert plugins["countdown"]["registers"]["domains"] == ["countdown"]
    assert plugins["countdown"]["version"] == "0.1.0"
    assert set(plugins["countdown"]) == {"name", "version", "registers"}


def test_plugins_table(propel_cli):
    out = propel_cli("plugins").stdout
    assert (
        "propel_plugins.rewards 0.1.0\n  reward rules: adversarial, hard, partial_instrumentation, probe_only, soft, solver_in_the_loop, wco"
        in out
    )


def test_bad_config_fails_before_models_load(propel_cli, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"domain:\n  name: countdown\nrun_dir: {tmp_path / 'run'}\n")
    result = propel_cli("generate", str(config), "reward.rule=wc0", "label.k=0", check=False)
    assert result.returncode == 1
    assert "label.k = 0: Input should be greater than 0" in result.stderr
    assert "Traceback" not in result.stderr
    result = propel_cli("run", str(config), "reward.rule=wc0", check=False)
    assert (
        "unknown reward rule 'wc0'; installed: adversarial, hard, partial_instrumentation, probe_only, soft, solver_in_the_loop, wco"
        in result.stderr
    )
    assert not (tmp_path / "run").exists()  # nothing written for a config that does not validate


@pytest.mark.slow
def test_generate_writes_records_and_resumes(propel_cli, tmp_path):
    from propel_core.records import Task, iter_jsonl

    config = tmp_path / "c.yaml"
    config.write_text(
        f"domain:\n  name: countdown\nrun_dir: {tmp_path / 'run'}\ngenerator:\n  sampling:\n    max_new_tokens: 12\n"
    )
    first = propel_cli("-q", "generate", str(config), "generate.num_tasks=3")
    assert "generated 3 -> parsed" in first.stdout
    tasks = list(iter_jsonl(tmp_path / "run" / "tasks.jsonl", Task))
    assert sorted(t.id for t in tasks) == ["t000000", "t000001", "t000002"]  # in the order they finished
    assert all(t.domain == "countdown" and t.generator == "SmolLM2-135M-Instruct" for t in tasks)
    assert all(t.validity.valid or t.validity.reason for t in tasks)
    assert all(t.generation.startswith("Target:") for t in tasks)  # the domain's prefill is kept
    assert (tmp_path / "run" / "config.yaml").exists()

    propel_cli("-q", "generate", str(config), "generate.num_tasks=5")
    resumed = list(iter_jsonl(tmp_path / "run" / "tasks.jsonl", Task))
    assert sorted(t.id for t in resumed) == [f"t00000{i}" for i in range(5)]
    assert resumed[:3] == tasks  # finished records untouched, none written twice


def test_plugins_listing_imports_no_heavy_library():
    """What keeps `propel --help` and `propel plugins` fast: no torch/transformers at import."""
    import subprocess
    import sys

    code = (
        "import sys; from click.testing import CliRunner; from propel_core.cli import cli;"
        "result = CliRunner().invoke(cli, ['plugins', '--json']); assert result.exit_code == 0, result.output;"
        "heavy = sorted({'torch', 'transformers', 'trl', 'peft'} & set(sys.modules)); print(heavy)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_global_flags_work_after_the_command(propel_cli, tmp_path):
    from propel_core.cli import global_flags_first

    assert global_flags_first(["generate", "c.yaml", "-q"]) == ["-q", "generate", "c.yaml"]
    assert global_flags_first(["--quiet", "run", "c.yaml", "label.k=4"]) == ["--quiet", "run", "c.yaml", "label.k=4"]
    assert global_flags_first(["config", "c.yaml", "--", "-q"]) == ["config", "c.yaml", "--", "-q"]
    config = tmp_path / "c.yaml"
    config.write_text("domain:\n  name: countdown\n")
    after = propel_cli("config", str(config), "-q")
    assert after.stdout == propel_cli("-q", "config", str(config)).stdout and "countdown" in after.stdout


def test_progress_reaches_a_log_without_a_terminal(propel_cli, tmp_path, monkeypatch):
    """stderr captured (not a terminal): plain progress lines every PROPEL_PROGRESS_INTERVAL seconds and
    one at the end, on the propel log; none with -q."""
    import re

    config = tmp_path / "c.yaml"
    config.write_text(f"domain:\n  name: arithmetic\nrun_dir: {tmp_path / 'run'}\n")
    monkeypatch.setenv("PROPEL_PROGRESS_INTERVAL", "0.2")
    result = propel_cli("generate", str(config), "generate.num_tasks=6", "generator.sampling.max_new_tokens=8")
    lines = [line for line in result.stderr.splitlines() if line.startswith("generate (SmolLM2-135M-Instruct): ")]
    assert len(lines) >= 3, result.stderr  # the model's turns take seconds: several lines while they run
    assert re.fullmatch(r"generate \(SmolLM2-135M-Instruct\): 6/6 done, [\d.]+/s, \d+ s", lines[-1]), lines
    assert any(re.search(r": [0-5]/6 done(, \d+ in flight)?", line) for line in lines[:-1]), lines
    assert "━" not in result.stderr + result.stdout  # no bar drawn for nobody

    quiet = propel_cli("generate", str(config), "generate.num_tasks=8", "generator.sampling.max_new_tokens=8", "-q")
    assert "done" not in quiet.stderr and "generated 8" in quiet.stdout
