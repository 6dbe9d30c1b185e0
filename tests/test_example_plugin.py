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
