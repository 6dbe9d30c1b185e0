"""A third-party domain package, pip-installed, shows up and is usable by name."""

import json
from pathlib import Path

import pytest

from propel_core.plans import validate_config
from propel_core.plugins import Registry, get_plugin_manager


def test_listed_by_propel_plugins(example_plugin, propel_cli):
    plugins = {p["name"]: p for p in json.loads(propel_cli("plugins", "--json").stdout)["plugins"]}
    assert plugins["reverse_word"] == {
        "name": "reverse_word",
        "version": "0.3.0",
        "registers": {"domains": ["reverse_word"], "validity_predicates": ["word_length"]},
    }


def test_selectable_in_config(example_plugin):
    registry = Registry.build(get_plugin_manager())
    config = validate_config({"domain": {"name": "reverse_word", "options": {"min_letters": 4}}}, registry)
    domain = registry.get("domains", config.domain.name)(**config.domain.options)
    assert domain.grade({"word": "stone"}, "enots").solved


def test_absent_when_not_installed(propel_cli):
    assert "reverse_word" not in propel_cli("plugins").stdout


@pytest.mark.slow
def test_generate_with_third_party_domain(example_plugin, propel_cli, tmp_path):
    from propel_core.records import Task, iter_jsonl

    config = tmp_path / "c.yaml"
    config.write_text(f"domain:\n  name: reverse_word\nrun_dir: {tmp_path}\ngenerate:\n  num_tasks: 4\n")
    propel_cli("-q", "generate", str(config), "generator.sampling.max_new_tokens=6")
    tasks = list(iter_jsonl(tmp_path / "tasks.jsonl", Task))
    assert len(tasks) == 4 and {t.domain for t in tasks} == {"reverse_word"}
    assert all(t.context_id.startswith("letter-") for t in tasks)
    parsed = [t for t in tasks if t.payload is not None]
    assert all(t.text == f"Reverse the letters of the word: {t.payload['word']}" for t in parsed)


@pytest.mark.slow
def test_the_small_arithmetic_config_runs_every_stage_and_repeats_from_its_seed(propel_cli, tmp_path):
    """small/arithmetic, the tutorial's ready config, through `propel run` on the embedded
    model: every stage writes its output. Run again from the same seed, killed (SIGKILL) while it labels
    and rerun to the end, it writes the same bytes in every file, but for the seconds TRL logs."""
    import shutil
    import sys
    from pathlib import Path

    from propel_core.records import Label, iter_jsonl
    from propel_core.stages import STAGES
    from propel_core.testing import digests, kill_when_written

    run = tmp_path / "run"  # both runs write here: the config they record names their run_dir
    result = propel_cli("-q", "run", "small/arithmetic", f"run_dir={run}")
    labels = list(iter_jsonl(run / "labels.jsonl", Label))
    assert {label.utility for label in labels} == {0, 1}  # both sides of the band: the probe has rows to tell apart
    outputs = {
        "generate": "tasks.jsonl",
        "label": "labels.jsonl",
        "extract": "activations",
        "probe": "probes/selected/probe.json",
        "train": "train/adapter/adapter_config.json",
        "evaluate": "eval/metrics.json",
        "report": "report.html",
    }
    assert set(outputs) == set(STAGES)
    assert all((run / path).exists() for path in outputs.values()), sorted(p.name for p in run.iterdir())
    assert "| utility (in band / all) |" in result.stdout  # evaluate's table
    first = digests(run)
    shutil.move(run, tmp_path / "first")

    command = [str(Path(sys.executable).with_name("propel")), "-q", "run", "small/arithmetic", f"run_dir={run}"]
    kill_when_written(command, run / "labels.jsonl", lines=3)
    propel_cli("-q", "run", "small/arithmetic", f"run_dir={run}")
    again = digests(run)
    assert sorted(again) == sorted(first)
    assert [name for name in sorted(first) if first[name] != again[name]] == []


def test_a_run_records_the_plugin_version_and_refuses_another(example_plugin, tmp_path, monkeypatch, pip_install_into):
    """settings.json names the distribution and version that registered each component and its
    options with their defaults; the same plugin at another version (installed in its place) makes
    adding to the corpus refuse, naming both versions."""
    import shutil
    import sys

    from propel_core.errors import PropelError
    from propel_core.run import Run

    config = {"run_dir": str(tmp_path / "run"), "domain": {"name": "reverse_word", "options": {"min_letters": 4}}}
    registry = Registry.build(get_plugin_manager())
    Run(validate_config(config, registry), registry).claim("tasks.jsonl", False)
    recorded = json.loads((tmp_path / "run" / "settings.json").read_text())["tasks.jsonl"]
    assert recorded["domain.name_plugins.reverse_word"] == "propel-reverse-word 0.3.0"
    assert recorded["domain.options.min_letters"] == 4 and recorded["domain.options.max_letters"] == 12  # its default
    assert recorded["generator.backend_plugins.transformers"].startswith("propel-core ")

    newer = tmp_path / "package"
    shutil.copytree(
        Path(__file__).parent / "example_plugin", newer, ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    (newer / "pyproject.toml").write_text(
        (newer / "pyproject.toml").read_text().replace('version = "0.3.0"', 'version = "0.4.0"')
    )
    pip_install_into(newer, tmp_path / "site")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *(p for p in sys.path if p != str(example_plugin))])
    for module in [name for name in sys.modules if name.startswith("propel_reverse_word")]:
        monkeypatch.delitem(sys.modules, module)
    upgraded = Registry.build(get_plugin_manager())
    with pytest.raises(PropelError) as refused:
        Run(validate_config(config, upgraded), upgraded).claim("tasks.jsonl", True)
    assert 'domain.name_plugins.reverse_word: "propel-reverse-word 0.3.0" -> "propel-reverse-word 0.4.0"' in str(
        refused.value
    )


def test_the_tutorials_propel_check_prints_what_it_shows(example_plugin, propel_cli, tmp_path):
    """docs/writing_plugins.md's `propel check` session, run as written on the installed example."""
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "writing_plugins.md").read_text()
    session = doc.split("$ cat samples.jsonl\n", 1)[1].split("```", 1)[0].splitlines()
    samples = session[: session.index(next(line for line in session if line.startswith("$ ")))]
    shown = session[session.index("$ propel check reverse_check.yaml --samples samples.jsonl") + 1 :]
    (tmp_path / "samples.jsonl").write_text("\n".join(samples) + "\n")
    (tmp_path / "reverse_check.yaml").write_text("domain: {name: reverse_word}\n")
    result = propel_cli("check", str(tmp_path / "reverse_check.yaml"), "--samples", str(tmp_path / "samples.jsonl"))
    assert result.stdout.splitlines() == shown
