"""The openai backend against a real OpenAI-compatible server from PyPI: ``transformers serve`` with
the embedded model. It refuses vLLM's request fields and ignores ``n``; generate and label still
work, with K attempts per label."""

import json
import sys
from pathlib import Path

import pytest

from propel_core.config import ModelConfig, Sampling
from propel_core.errors import PropelError
from propel_core.plugins import Registry
from propel_core.records import Label, Task, iter_jsonl
from propel_core.testing import serving_embedded_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served():
    """``transformers serve`` on a free loopback port with the embedded model; (base URL, model name)."""
    if not Path(sys.executable).with_name("transformers").exists():
        pytest.skip("transformers serve is not installed (pip install 'transformers[serving]')")
    with serving_embedded_model() as server:
        yield server


def backend(served, **options):
    url, model = served
    return Registry.build().backend(ModelConfig(backend="openai", model=model, base_url=url, **options))


def test_vllm_fields_are_refused_with_the_switch_named(served):
    prefilled = [{"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "Answer:"}]
    with pytest.raises(PropelError, match="set server_extensions: false"):
        backend(served).generate([prefilled], Sampling(temperature=0.7, max_new_tokens=4))
    (texts,) = backend(served, server_extensions=False).generate(
        [prefilled], Sampling(temperature=0.7, top_k=20, max_new_tokens=4)
    )
    assert len(texts) == 1


def test_a_server_that_ignores_n_still_gives_n_completions(served):
    (texts,) = backend(served, server_extensions=False).generate(["Name a color."], Sampling(max_new_tokens=6), n=3)
    assert len(texts) == 3


def test_generate_and_label_through_the_server(served, tmp_path, propel_cli):
    url, model = served
    solver = {
        "backend": "openai",
        "model": model,
        "base_url": url,
        "server_extensions": False,
        "sampling": {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 12},
    }
    config = {
        "run_dir": str(tmp_path),
        "domain": {"name": "arithmetic"},
        "generate": {"num_tasks": 6},
        "label": {"k": 3},
        "executor": {"workers": 4},
        "generator": {**solver, "sampling": {"temperature": 1.0, "max_new_tokens": 20}},
        "solver": solver,
    }
    (tmp_path / "run.yaml").write_text(json.dumps(config))
    propel_cli("-q", "generate", str(tmp_path / "run.yaml"))
    tasks = list(iter_jsonl(tmp_path / "tasks.jsonl", Task))
    assert len(tasks) == 6 and all(task.generation.startswith("Compute:") for task in tasks)
    valid = [task for task in tasks if task.validity.valid]
    out = propel_cli("-q", "label", str(tmp_path / "run.yaml")).stdout
    labels = list(iter_jsonl(tmp_path / "labels.jsonl", Label))
    assert sorted(label.task_id for label in labels) == sorted(task.id for task in valid)
    assert all(len(label.attempts) == 3 for label in labels)
    assert out.startswith(f"labeled {len(valid)}:")
