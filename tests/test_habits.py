"""What users of TRL and verl expect on day one: metrics reach their tracker from every stage, runs
refuse to mix settings, configs merge and print, artifacts are read without propel, floors are real."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from propel_core.domain import make_task
from propel_core.errors import PropelError
from propel_core.execution import task_id
from propel_core.records import JsonlWriter, Label, iter_jsonl
from propel_core.run import start_run

ROOT = Path(__file__).resolve().parent.parent
#: arithmetic generations ("Compute:" is the prefill): some easy, some with products (often in band)
WRITES = ["3 + 4", "23 * 45", "hello", "31 * 17", "2 + 2", "12 * 13", "64 / 16 * 3", "7 + 1"]


def labeled_run(folder: Path, *overrides: str):
    """A run whose tasks.jsonl holds WRITES, labeled by the simulated solver (no model loaded)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "run.yaml"
    config.write_text(
        f"run_dir: {folder}\ndomain: {{name: arithmetic}}\nsolver: {{backend: arithmetic_skill}}\nlabel: {{k: 4}}\n"
    )
    run = start_run([config], list(overrides), quiet=True)
    if not (folder / "tasks.jsonl").exists():
        domain = run.domain()
        predicates = {name: run.component("validity_predicates", name) for name in domain.validity_predicates}
        contexts = domain.contexts()
        with JsonlWriter(folder / "tasks.jsonl") as out:
            for i, text in enumerate(WRITES):
                out.write(make_task(task_id(i), domain, contexts[i], f"Compute: {text}", "m", predicates))
        run.claim("tasks.jsonl", exists=False)  # as generate records what it made them with
    return run


def test_label_metrics_reach_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from propel_core.stages.label import label

    run = labeled_run(tmp_path, "report_to=tensorboard")
    label(run)
    labels = list(iter_jsonl(tmp_path / "labels.jsonl", Label))
    events = EventAccumulator(str(tmp_path / "tensorboard" / "label"))
    events.Reload()
    assert events.Scalars("label/in_band")[0].value == sum(label.utility == 1 for label in labels)
    assert events.Scalars("label/labeled")[0].value == len(labels) > 0
    assert "label/solved_4_of_4" in events.Tags()["scalars"]


def test_tracking_off_by_default_and_a_missing_tracker_is_one_line(tmp_path):
    from propel_core.tracking import Tracker

    run = labeled_run(tmp_path)
    run.track("label", {"x": 1.0})
    assert not (tmp_path / "tensorboard").exists()
    with pytest.raises(PropelError, match=r"report_to names trackio, which is not installed: pip install trackio"):
        Tracker(["trackio"], tmp_path).log("label", {"x": 1.0})


def test_a_rerun_with_other_settings_refuses_instead_of_mixing(tmp_path):
    from propel_core.stages.label import label

    label(labeled_run(tmp_path))
    before = (tmp_path / "labels.jsonl").read_text()
    with pytest.raises(PropelError) as refused:
        label(labeled_run(tmp_path, "label.k=6"))
    message = str(refused.value)
    assert "labels.jsonl was made with other settings (label.k: 4 -> 6)" in message and "\n" not in message
    assert "new run_dir" in message and "allow_changed_settings=true" in message
    assert (tmp_path / "labels.jsonl").read_text() == before  # nothing lost, nothing mixed
    label(labeled_run(tmp_path, "solver.batch_size=3", "executor.workers=2"))  # how it runs: allowed
    with pytest.raises(PropelError, match=r"tasks.jsonl was made with other settings \(generator.sampling.top_p: "):
        from propel_core.stages.generate import generate

        generate(labeled_run(tmp_path, "generator.sampling.top_p=0.5"))
    label(labeled_run(tmp_path, "label.k=6", "allow_changed_settings=true"))  # the explicit way on


def test_configs_merge_in_order_and_print_resolved(tmp_path, propel_cli):
    (tmp_path / "a.yaml").write_text(f"run_dir: {tmp_path / 'run'}\ndomain: {{name: countdown}}\nlabel: {{k: 4}}\n")
    (tmp_path / "b.yaml").write_text("label: {k: 6, band_high: 0.5}\n")
    out = propel_cli("config", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"), "label.k=7").stdout
    import yaml

    resolved = yaml.safe_load(out)
    assert (resolved["label"]["k"], resolved["label"]["band_high"], resolved["domain"]["name"]) == (7, 0.5, "countdown")
    assert not (tmp_path / "run").exists()  # printing runs nothing and writes nothing
    bad = propel_cli("config", str(tmp_path / "a.yaml"), "label.k=zero", check=False)
    assert bad.returncode == 1 and "label.k" in bad.stderr
    missing = propel_cli("label", str(tmp_path / "nope.yaml"), check=False)
    assert missing.returncode != 0 and "nope.yaml" in missing.stderr


def test_export_is_a_dataset_that_loads_without_propel(tmp_path, propel_cli):
    from datasets import load_from_disk

    from propel_core.stages.label import label

    label(labeled_run(tmp_path / "run"))
    out = propel_cli("export", str(tmp_path / "run"), "--to", str(tmp_path / "data")).stdout
    assert "corpus" in out
    data = load_from_disk(str(tmp_path / "data"))
    corpus = data["corpus"]
    labels = {label.task_id: label for label in iter_jsonl(tmp_path / "run" / "labels.jsonl", Label)}
    assert corpus.num_rows == len(WRITES) and sum(corpus["labeled"]) == len(labels)
    for row in corpus:
        if row["labeled"]:
            assert row["utility"] == labels[row["id"]].utility and len(row["solved"]) == 4


def test_dependency_floors_admit_only_versions_with_what_the_code_calls():
    """The installed TRL has what propel calls, and the floors in pyproject.toml are the versions
    these features came with (so an older install fails at pip time, not deep inside training)."""
    import inspect

    from packaging.specifiers import SpecifierSet
    from trl import GRPOConfig, GRPOTrainer

    from propel_core.config import TrainConfig

    assert "rollout_func" in inspect.signature(GRPOTrainer.__init__).parameters  # multi-turn training
    from trl.rewards import get_soft_overlong_punishment  # noqa: F401  (train.overlong_buffer)

    offered = TrainConfig.model_fields["loss_type"].annotation.__args__
    for loss in offered:  # TRL validates its own loss types: each one propel offers must pass
        GRPOConfig(output_dir="/tmp/unused", loss_type=loss, use_cpu=True, report_to="none")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]:
        name, _, spec = requirement.partition(">=")
        if spec:  # a requirement without a floor (transformers[serving]) leaves the floor as it is
            floors[name.split("[")[0].strip()] = SpecifierSet(">=" + spec.split(";")[0])
    assert "1.8.9" not in floors["trl"] and "1.9.0" in floors["trl"]  # rollout_func, all six loss types
    assert "0.12.0" not in floors["peft"] and "0.21.0" not in floors["vllm"]  # below what TRL 1.9+ supports
    # no floor below the one the installed TRL itself declares for what it shares with propel
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    for requirement in map(Requirement, importlib.metadata.requires("trl")):
        theirs = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        ours = floors.get(requirement.name)
        if theirs and ours and not requirement.marker:
            (floor,) = [Version(s.version) for s in ours if s.operator == ">="]
            assert floor >= max(theirs), f"{requirement.name}>={floor} is below TRL's own floor {max(theirs)}"
    assert "httpx" not in floors and "openai" not in project["optional-dependencies"]  # nothing imports it


@pytest.mark.slow
def test_a_probe_bundle_reads_with_plain_transformers_and_safetensors(tmp_path, propel_registry):
    """The documented few lines (docs/library.md, 'Reading a probe bundle without propel') give the
    logits propel's scorer gives."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from propel_core.config import ModelConfig
    from propel_core.embedded import resolve_model
    from propel_core.probes import TrainedProbe, load_probe, reference_settings, save_bundle
    from propel_core.records import ProbeBundle

    torch.manual_seed(0)
    head = propel_registry.get("probe_architectures", "mlp")(576)
    bundle = ProbeBundle(
        reference_model="SmolLM2-135M-Instruct", reference=reference_settings(ModelConfig()), layer=5,
        pooling="mean_full", architecture="mlp", input_dim=576, max_length=64, temperature=1.7, training_rows=0,
    )  # fmt: skip
    save_bundle(tmp_path, TrainedProbe(head, torch.randn(576), torch.rand(576) + 0.5, epochs=0), bundle)
    texts = ["Compute: 23 * 45", "Target: 24\nNumbers: 3, 8, 8"]
    expected = [s["logit"] for s in load_probe(tmp_path, propel_registry).score(texts)]

    # the documented lines: the reference's hidden states after block `layer`, mean-pooled over the
    # tokens, standardized, the head's Linear layers with ReLU between them, the temperature
    meta = json.loads((tmp_path / "probe.json").read_text())
    weights = load_file(tmp_path / "probe.safetensors")
    path = resolve_model(meta["reference"]["model"])  # a hub id, or the embedded default's local copy
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    logits = []
    for text in texts:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=meta["max_length"])
        with torch.no_grad():
            hidden = model(**ids, output_hidden_states=True).hidden_states[meta["layer"]][0]
        x = (hidden.mean(0) - weights["mean"]) / weights["std"]
        layers = sorted({int(key.split(".")[1]) for key in weights if key.startswith("head.")})
        for i in layers:
            x = x @ weights[f"head.{i}.weight"].T + weights[f"head.{i}.bias"]
            x = torch.relu(x) if i != layers[-1] else x
        logits.append(float(x[0]) / meta["temperature"])
    assert logits == pytest.approx(expected, abs=1e-3)


@pytest.mark.slow
def test_training_killed_after_a_checkpoint_resumes_from_it(tmp_path, propel_cli):
    """SIGKILL `propel train` once a checkpoint is saved; the rerun goes on from it to the last step,
    with one reward-log entry per step, and a rerun with other training settings is refused."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "run.yaml").write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: arithmetic}}\nsolver: {{backend: arithmetic_skill}}\n"
        "label: {k: 2}\nreward: {rule: solver_in_the_loop}\n"
        "train: {steps: 3, group_size: 2, per_device_batch: 2, gradient_accumulation: 1,\n"
        "        max_completion_length: 12, checkpoint_every: 1, gradient_checkpointing: false}\n"
    )
    command = [str(Path(sys.executable).with_name("propel")), "-q", "train", str(tmp_path / "run.yaml")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "train" / "checkpoint-1" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not state.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "training ended before its first checkpoint"
    time.sleep(0.5)  # let the checkpoint's last files land
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "train" / "adapter").exists()

    refused = propel_cli("train", str(tmp_path / "run.yaml"), "train.lr=1e-3", check=False)
    assert refused.returncode == 1 and "train was made with other settings (train.lr: 5e-05 -> 0.001)" in refused.stderr

    resumed = propel_cli("train", str(tmp_path / "run.yaml"))
    assert "resuming from" in resumed.stderr and "checkpoint-" in resumed.stderr
    steps = [json.loads(line)["step"] for line in (tmp_path / "train" / "reward_log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]  # each step once: the killed run's, then the resumed run's
    final = json.loads((tmp_path / "train" / "checkpoint-3" / "trainer_state.json").read_text())
    assert final["global_step"] == 3 and (tmp_path / "train" / "adapter" / "adapter_model.safetensors").exists()
    again = propel_cli("train", str(tmp_path / "run.yaml"))  # a finished run: nothing trains again
    assert "is at the last step (3): nothing to train" in again.stderr
    assert not (tmp_path / "train" / "checkpoint-4").exists()
    assert [
        json.loads(line)["step"] for line in (tmp_path / "train" / "reward_log.jsonl").read_text().splitlines()
    ] == [
        0,
        1,
        2,
    ]
