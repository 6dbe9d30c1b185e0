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
        predicates = run.registry.validity_predicates(domain)
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


def wandb_history(run_dir: Path) -> list[dict]:
    """The metrics rows of the one offline wandb run under ``run_dir/wandb``, read back from its
    ``run-ID.wandb`` file: a 7-byte header (":W&B", magic, version), then LevelDB log records (crc,
    length, type) in 32 KiB blocks, each record a wandb ``Record`` protobuf."""
    import struct

    from wandb.proto.wandb_internal_pb2 import Record

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block, position, pending, rows = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
    return rows


def test_label_metrics_reach_wandb_and_trackio(tmp_path, propel_cli, monkeypatch):
    """Both trackers for real, through the propel command: wandb in offline mode (its run file under
    the run folder) and trackio (its local SQLite store in TRACKIO_DIR), each read back."""
    import sqlite3

    labeled_run(tmp_path)
    for variable, folder in [
        ("TRACKIO_DIR", "trackio"),
        ("WANDB_CONFIG_DIR", "wandb-config"),
        ("WANDB_CACHE_DIR", "wandb-cache"),
        ("WANDB_DATA_DIR", "wandb-data"),
    ]:
        monkeypatch.setenv(variable, str(tmp_path / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    propel_cli("label", str(tmp_path / "run.yaml"), "report_to=[wandb,trackio]")
    labels = list(iter_jsonl(tmp_path / "labels.jsonl", Label))
    expected = {"label/labeled": len(labels), "label/in_band": sum(label.utility == 1 for label in labels)}
    assert expected["label/labeled"] > 0

    (row,) = wandb_history(tmp_path)
    assert {key: row[key] for key in expected} == expected

    with sqlite3.connect(tmp_path / "trackio" / "propel.db") as db:
        (run_name, metrics), *others = db.execute("SELECT run_name, metrics FROM metrics").fetchall()
    assert not others and run_name == tmp_path.name
    assert {key: json.loads(metrics)[key] for key in expected} == expected


def test_tracking_off_by_default_and_a_missing_tracker_is_one_line(tmp_path, monkeypatch):
    import sys

    from propel_core.tracking import Tracker

    run = labeled_run(tmp_path)
    run.track("label", {"x": 1.0})
    assert not (tmp_path / "tensorboard").exists()
    monkeypatch.setitem(sys.modules, "trackio", None)  # Python's own way to make a module not importable
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
    from propel_core.probes.bundles import load_probe, reference_settings, save_bundle
    from propel_core.probes.heads import TrainedProbe
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
    with one reward-log entry per step, and a rerun with other training settings, another reward rule or
    (for a rule that runs the solver) other solver settings is refused."""
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "run.yaml").write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: arithmetic}}\nsolver: {{backend: arithmetic_skill}}\n"
        "label: {k: 2}\nreward: {rule: solver_in_the_loop}\n"
        "train: {steps: 3, group_size: 2, per_device_batch: 2, gradient_accumulation: 1,\n"
        "        max_completion_length: 12, gradient_checkpointing: false}\ncheckpoint: {every: 1}\n"
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
    rule = propel_cli("train", str(tmp_path / "run.yaml"), "reward.rule=hard", check=False)  # one adapter, one rule
    assert rule.returncode == 1 and 'reward.rule: "solver_in_the_loop" -> "hard"' in rule.stderr
    solver = propel_cli("train", str(tmp_path / "run.yaml"), "solver.sampling.temperature=0.9", check=False)
    assert solver.returncode == 1 and "(solver.sampling.temperature: 0.6 -> 0.9)" in solver.stderr  # the rule reads it

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


def test_a_stages_own_settings_replace_what_its_inputs_recorded(tmp_path):
    """The probe stage records the reward options it selected with; a training whose own options are
    fewer (an option dropped, back to its default) is another training, not the probe's options again."""
    from propel_core.config import validate_config
    from propel_core.provenance import claim

    def config(**options):
        data = {"domain": {"name": "countdown"}, "reward": {"rule": "soft", "options": {"soft": options}}}
        return validate_config(data).model_dump(mode="json")

    clipped = config(clip_low=0.3)
    claim(tmp_path, "probes", clipped, False, False, ("reward.options.soft",))
    claim(tmp_path, "train", clipped, False, False, ("reward.options.soft",))
    with pytest.raises(PropelError, match=r"reward.options.soft.clip_low: 0.3 -> null"):
        claim(tmp_path, "train", config(), True, False, ("reward.options.soft",))
    recorded = json.loads((tmp_path / "settings.json").read_text())
    assert recorded["train"]["reward.options.soft.clip_low"] == 0.3  # a refusal records nothing
    # another rule's options are not this training's: changing them refuses nothing
    other = validate_config(
        {
            "domain": {"name": "countdown"},
            "reward": {"rule": "soft", "options": {"soft": {"clip_low": 0.3}, "hard": {}}},
        }
    )
    claim(tmp_path, "train", other.model_dump(mode="json"), True, False, ("reward.options.soft",))


def test_a_bundle_is_known_by_its_content_and_starting_over_clears_the_folder(tmp_path):
    from propel_core.provenance import folder_digest
    from propel_core.training.checkpoints import prepare_folder

    bundle = tmp_path / "probe"
    bundle.mkdir()
    (bundle / "probe.json").write_text("{}")
    (bundle / "probe.safetensors").write_bytes(b"ab")
    first = folder_digest(bundle)
    moved = tmp_path / "elsewhere"
    bundle.rename(moved)
    assert folder_digest(moved) == first and folder_digest(bundle) is None
    (moved / "probe.safetensors").write_bytes(b"ba")
    assert folder_digest(moved) != first
    (moved / "probe.json").write_text("{}a")  # a byte moved from one file to the other is another bundle
    (moved / "probe.safetensors").write_bytes(b"b")
    assert folder_digest(moved) not in (first, None)

    folder = tmp_path / "train"
    (folder / "adapter").mkdir(parents=True)
    for name in ("log.jsonl", "reward_log.jsonl", "completions.jsonl"):
        (folder / name).write_text("{}\n")
    assert prepare_folder(folder, resume=True) is None  # no checkpoint: a new training, whose files go
    assert sorted(p.name for p in folder.iterdir()) == []


def test_a_refusals_file_of_another_shape_is_read_as_none(tmp_path):
    from propel_core.provenance import record_refusal, refusals

    for text in (
        "[1]",
        '"x"',
        '{"probe": {"reason": 42, "blocks": []}}',
        '{"probe": {"reason": "r", "blocks": "train"}}',
    ):
        (tmp_path / "refusals.json").write_text(text)
        assert refusals(tmp_path) == {}
    record_refusal(tmp_path, "probe", "all labels outside the band", ("train", "evaluate"))
    assert refusals(tmp_path) == {"probe": {"reason": "all labels outside the band", "blocks": ["train", "evaluate"]}}
    record_refusal(tmp_path, "probe", None)
    assert refusals(tmp_path) == {}


def test_a_finished_adapter_without_checkpoints_is_not_retrained_under_another_rule(tmp_path, propel_cli):
    """Checkpoints removed to free the disk leave the adapter: a rerun with another rule still refuses,
    and the adapter is still there after the refusal (the claim comes before anything is removed). An
    evaluation's base arm does not depend on what was trained."""
    from propel_core.config import validate_config
    from propel_core.provenance import claim

    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"run_dir: {tmp_path}\ndomain: {{name: countdown}}\n")
    config = validate_config({"run_dir": str(tmp_path), "domain": {"name": "countdown"}}).model_dump(mode="json")
    claim(tmp_path, "train", config, False, False, ("reward.options.hard",), {"reward.bundles": [None]})
    (tmp_path / "train" / "adapter").mkdir(parents=True)
    (tmp_path / "train" / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    refused = propel_cli("-q", "train", str(cfg), "reward.rule=soft", check=False)
    assert refused.returncode == 1 and 'reward.rule: "hard" -> "soft"' in refused.stderr
    assert (tmp_path / "train" / "adapter" / "adapter_model.safetensors").read_bytes() == b"weights"

    claim(tmp_path, "eval/base", config, False, False, values={"adapter": None})
    other = validate_config({"run_dir": str(tmp_path), "domain": {"name": "countdown"}, "reward": {"rule": "soft"}})
    claim(tmp_path, "train", other.model_dump(mode="json"), False, False, ("reward.options.soft",))
    claim(tmp_path, "eval/base", other.model_dump(mode="json"), True, False, values={"adapter": None})
