"""A third-party domain package, pip-installed, shows up and is usable by name."""

import json

import pytest

from propel_core.config import validate_config
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
def test_the_tiny_config_runs_every_stage(propel_cli, tmp_path):
    """tests/example_plugin/tiny.yaml, the tutorial's ready config, through `propel run` on the embedded
    model: every stage writes its output (a few minutes on 2 cores)."""
    from pathlib import Path

    from propel_core.records import Label, iter_jsonl
    from propel_core.stages import STAGES

    tiny = Path(__file__).parent / "example_plugin" / "tiny.yaml"
    result = propel_cli("-q", "run", str(tiny), f"run_dir={tmp_path}")
    labels = list(iter_jsonl(tmp_path / "labels.jsonl", Label))
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
    assert all((tmp_path / path).exists() for path in outputs.values()), sorted(p.name for p in tmp_path.iterdir())
    assert "| utility (in band / all) |" in result.stdout  # evaluate's table
