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

    labeled_run(tmp_path).release()  # this process lets go of the folder, for the command it starts there
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


def test_propel_config_refuses_a_derived_setting_before_any_stage_runs(tmp_path, propel_cli):
    """evaluate.k below label.min_valid_attempts leaves every evaluation label unknown after the
    solver's whole cost: the evaluation's plan refuses it when the config is read, in one line naming
    both settings; the same config with evaluate.k raised is printed."""
    (tmp_path / "c.yaml").write_text(
        f"run_dir: {tmp_path / 'run'}\ndomain: {{name: countdown}}\nlabel: {{k: 8, min_valid_attempts: 6}}\n"
    )
    refused = propel_cli("config", str(tmp_path / "c.yaml"), "evaluate.k=4", check=False)
    lines = [line for line in refused.stderr.splitlines() if "evaluate.k (4)" in line]
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    assert len(lines) == 1 and "label.min_valid_attempts (6)" in lines[0], refused.stderr
    assert propel_cli("config", str(tmp_path / "c.yaml"), "evaluate.k=6").returncode == 0
    assert not (tmp_path / "run").exists()


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


def launch(*arguments: str) -> list[str]:
    """``accelerate launch`` of two processes with the shipped DDP file, over gloo (this machine has no
    GPU, so no bf16), on a free port."""
    import socket
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    flags = ["--config_file", str(ROOT / "docs" / "accelerate" / "ddp.yaml"), "--num_processes", "2"]
    return [accelerate, "launch", *flags, "--mixed_precision", "no", "--main_process_port", str(port), *arguments]


def test_the_shipped_accelerate_files_are_what_accelerate_reads():
    """docs/accelerate/: DDP, DeepSpeed ZeRO-2 and FSDP 2, each read by accelerate's own loader (which
    refuses a key it does not know) and launched by the line in its header."""
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {}
    for path in sorted((ROOT / "docs" / "accelerate").glob("*.yaml")):
        config = load_config_from_file(str(path))
        kinds[path.name] = config.distributed_type.value
        assert f"--config_file docs/accelerate/{path.name} -m propel_core.cli train run.yaml" in path.read_text()
    assert kinds == {
        "ddp.yaml": "MULTI_GPU",
        "deepspeed_zero2.yaml": "DEEPSPEED",
        "fsdp.yaml": "FSDP",
    }


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs (torch's launcher starts its workers in sessions of
    their own, out of reach of a signal to its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def ended(pids: list[int], timeout: float = 60) -> None:
    """Wait until each of ``pids`` has ended: gone, or a zombie whose threads have all exited (the
    last one closes the process's files; the first to go leaves a zombie leader behind)."""
    import time

    def done(pid: int) -> bool:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
        except (OSError, IndexError):  # gone
            return True
        return all(state in ("Z", "X") for state in states)

    deadline = time.monotonic() + timeout
    for pid in pids:
        while not done(pid):
            if time.monotonic() > deadline:
                pytest.fail(f"process {pid} did not end {timeout} s after SIGKILL")
            time.sleep(0.05)


@pytest.mark.slow
def test_a_training_on_two_processes_writes_each_step_once_and_resumes_after_kill_9(tmp_path):
    """`propel train` under `accelerate launch` of two processes (DDP over gloo), killed with SIGKILL
    (launcher and processes) once a checkpoint is saved: the rerun goes on from it to the last step. Each
    step is one reward-log entry and one completions entry covering both processes' completions, the
    context sampler saw the whole step, the closing line is said once, the adapter is float32; a rerun
    with other training settings, another reward rule or (for a rule that runs the solver) other solver
    settings is refused."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    from safetensors.torch import load_file

    from propel_core.folder_lock import release
    from propel_core.stages import run_stage

    (tmp_path / "run.yaml").write_text(
        f"run_dir: {tmp_path}\ndomain: {{name: arithmetic}}\nsolver: {{backend: arithmetic_skill}}\n"
        "label: {k: 2}\nreward: {rule: solver_in_the_loop}\ngenerate: {context_sampler: progress}\n"
        "train: {steps: 2, group_size: 2, per_device_batch: 2, gradient_accumulation: 1,\n"
        "        max_completion_length: 12, gradient_checkpointing: false}\ncheckpoint: {every: 1}\n"
    )
    train = launch("-m", "propel_core.cli", "train", str(tmp_path / "run.yaml"))
    process = subprocess.Popen(train, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "train" / "checkpoint-1" / "trainer_state.json"
    deadline = time.monotonic() + 600
    while not state.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "training ended before its first checkpoint"
    time.sleep(0.5)  # let the checkpoint's last files land
    killed = [process.pid, *descendants(process.pid)]
    for pid in killed:  # the launcher and both processes, as a lost node
        os.kill(pid, signal.SIGKILL)
    process.wait()
    ended(killed)  # the workers' files, the folder's lock among them, close as they end, a moment later
    assert not (tmp_path / "train" / "adapter").exists()

    for override, refusal in [
        ("train.lr=1e-3", "train was made with other settings (train.lr: 5e-05 -> 0.001)"),
        ("reward.rule=hard", 'reward.rule: "solver_in_the_loop" -> "hard"'),  # one adapter, one rule
        ("solver.sampling.temperature=0.9", "(solver.sampling.temperature: 0.6 -> 0.9)"),  # the rule reads it
    ]:
        with pytest.raises(PropelError) as refused:
            run_stage(start_run([tmp_path / "run.yaml"], [override], quiet=True), "train")
        assert refusal in str(refused.value)
    release(tmp_path)  # this process took the folder the killed launch had held: the launch below needs it

    resumed = subprocess.run(train, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stderr.count("resuming from") == 1  # logged by the main process
    assert resumed.stdout.count("trained 2 steps; reward mean first") == 1  # said once, by the main process
    entries = [json.loads(line) for line in (tmp_path / "train" / "reward_log.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in entries] == [0, 1]  # each step once: the killed run's, then the resumed one's
    samples = [json.loads(line) for line in (tmp_path / "train" / "completions.jsonl").read_text().splitlines()]
    assert [sample["step"] for sample in samples] == [0, 1]
    for entry, sample in zip(entries, samples, strict=True):
        rewards = [completion["reward"] for completion in sample["completions"]]
        assert len(rewards) == 4  # two processes, a group of two each: the whole step
        assert sum(rewards) / 4 == pytest.approx(entry["reward_mean"])
        assert entry["sampler"]["degenerate_groups"] == entry["degenerate_groups"]  # the sampler saw both groups
    weights = load_file(tmp_path / "train" / "adapter" / "adapter_model.safetensors")
    assert {str(tensor.dtype) for tensor in weights.values()} == {"torch.float32"}
    assert json.loads((tmp_path / "train" / "log.jsonl").read_text().splitlines()[-1])["train_runtime"] > 0
    # a rerun of the finished training trains nothing: the last checkpoint's adapter and log are the result
    from types import SimpleNamespace

    from propel_core.training.checkpoints import last_checkpoint, train_and_save

    shutil.rmtree(tmp_path / "train" / "adapter")
    last = last_checkpoint(tmp_path / "train")
    train_and_save(SimpleNamespace(args=SimpleNamespace(max_steps=2)), tmp_path / "train", "base", last)
    assert load_file(tmp_path / "train" / "adapter" / "adapter_model.safetensors").keys() == weights.keys()
    assert last.name == "checkpoint-2" and len((tmp_path / "train" / "log.jsonl").read_text().splitlines()) == 2


def test_a_stages_own_settings_replace_what_its_inputs_recorded(tmp_path):
    """The probe stage records the reward options it selected with; a training whose own options are
    fewer (an option dropped, back to its default) is another training, not the probe's options again."""
    from propel_core.plans import validate_config
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


def test_a_bundle_is_known_by_its_content_and_starting_over_moves_the_folder_aside(tmp_path):
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
    with pytest.raises(PropelError, match=r"holds a training .* but no checkpoint to resume from"):
        prepare_folder(folder, True, print)  # no checkpoint: nothing to go on from, nothing moved
    said = []
    assert prepare_folder(folder, False, said.append) is None  # starting over: the old training is kept aside
    assert sorted(p.name for p in folder.iterdir()) == []
    (aside,) = tmp_path.glob("train.old-*")
    assert sorted(p.name for p in aside.iterdir()) == ["adapter", "completions.jsonl", "log.jsonl", "reward_log.jsonl"]
    assert said == [f"starting {folder} over: the training it held is kept in {aside}"]


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
    from propel_core.plans import validate_config
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


def test_a_launch_of_several_processes_runs_only_the_stages_made_for_it(tmp_path, monkeypatch):
    """Under `accelerate launch` of several processes, a stage that runs in one process (rank, label,
    evaluate, ...) refuses before it reads or writes anything; train and solve-train are the ones made
    for it."""
    from propel_core.ranks import DISTRIBUTED_STAGES
    from propel_core.stages import FOLLOW_UPS, STAGES, run_stage

    run = labeled_run(tmp_path)
    before = sorted(path.name for path in tmp_path.iterdir())
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in [*STAGES, *FOLLOW_UPS]:
        if name in DISTRIBUTED_STAGES:
            continue
        with pytest.raises(PropelError, match=rf"`propel {name}` runs in one process, and accelerate launch started 2"):
            run_stage(run, name)
    assert sorted(path.name for path in tmp_path.iterdir()) == before
    assert set(DISTRIBUTED_STAGES) == {"train", "solve-train"}


def test_a_launch_that_asked_for_several_processes_and_started_one_says_so(tmp_path, monkeypatch):
    """`accelerate launch --cpu --num_processes 2` starts one process: the launcher's command line says
    what was asked, and the run warns that it is not distributed."""
    from propel_core import ranks

    parent = tmp_path / "cmdline"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for words, asked in [
        (["accelerate", "launch", "--cpu", "--num_processes", "2", "-m", "propel_core.cli", "train"], 2),
        (["accelerate", "launch", "--num_processes=4", "x.py"], 4),
        (["accelerate", "launch", "--num-processes", "1", "x.py"], 1),
        (["accelerate", "launch", "x.py", "--num_processes"], None),
    ]:
        parent.write_bytes("\0".join(words).encode() + b"\0")
        assert ranks.asked_processes(parent) == asked
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert ranks.asked_processes(parent) is None  # not started by accelerate launch
    monkeypatch.setattr(ranks, "asked_processes", lambda: 2)
    assert "asked for 2 processes and started one" in ranks.launch_warning()
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ranks.launch_warning() is None


def test_an_adapter_saved_in_bfloat16_is_rewritten_in_float32(tmp_path):
    """DeepSpeed under TRL's default bf16 saves a bfloat16 adapter; train_and_save keeps one dtype."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from propel_core.training.checkpoints import in_float32

    weights = tmp_path / "adapter_model.safetensors"
    tensors = {"a": torch.randn(3, 4, dtype=torch.bfloat16), "steps": torch.arange(3)}
    save_file(tensors, weights, {"format": "pt"})
    in_float32(weights)
    out = load_file(weights)
    assert out["a"].dtype == torch.float32 and torch.equal(out["a"], tensors["a"].float())
    assert torch.equal(out["steps"], tensors["steps"])
    with safe_open(weights, "pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    written = weights.stat().st_mtime_ns
    in_float32(weights)  # already float32: left as it is
    assert weights.stat().st_mtime_ns == written


def test_fsdp_refuses_what_would_run_other_forward_passes_in_each_process(monkeypatch, propel_registry):
    """Under FSDP the processes must run the same forward passes on the sharded policy: a multi-turn
    domain (episodes of other lengths) and train.audit (the main process copies the adapter alone) are
    refused before any model loads; DDP takes both."""
    from propel_core.config import TrainConfig
    from propel_core.training.generator import _check

    arithmetic = propel_registry.domain("arithmetic")
    _check(arithmetic, TrainConfig(), audited=True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(PropelError, match="under FSDP every process must run the same forward passes"):
        _check(arithmetic, TrainConfig(), audited=True)
    _check(arithmetic, TrainConfig(), audited=False)


def test_settings_recorded_before_defaults_and_versions_were_still_resume(tmp_path, propel_registry):
    """A settings.json written before propel spelled out components' defaults and versions is not refused
    for lacking them, also where a record took its values from an input recorded the old way and the
    input is rewritten later; an option it holds is still compared, so one set then and left to its
    default now refuses."""
    from propel_core.config import resolved
    from propel_core.plans import validate_config
    from propel_core.provenance import flat, settings_of
    from propel_core.run import Run

    def run(**soft):
        data = {"run_dir": str(tmp_path), "domain": {"name": "arithmetic"}, "reward": {"rule": "soft"}}
        if soft:
            data["reward"]["options"] = {"soft": soft}
        return Run(validate_config(data, propel_registry), propel_registry)

    old = run(clip_low=0.3)
    plain = old.config.model_dump(mode="json")
    soft = ("reward.options.soft",)  # the probe stage's own keys for this rule
    assert "reward.options.soft.clip_high" not in flat(plain)
    recorded = {name: settings_of(name, plain, {}) for name in ("tasks.jsonl", "labels.jsonl")}
    (tmp_path / "settings.json").write_text(json.dumps(recorded | {"probes": settings_of("probes", plain, {}, soft)}))
    old.claim("probes", True, soft)  # the same settings, recorded the old way: taken
    record = json.loads((tmp_path / "settings.json").read_text())["probes"]
    assert record["reward.options.soft.clip_high"] == 0.95  # the default, spelled out now
    assert record["reward.rule_plugins.soft"] == resolved(old.config, propel_registry)["reward"]["rule_plugins"]["soft"]
    # labels resumed, the corpus grown (rewritten the new way), labels again: nothing changed, nothing refused
    for output in ("labels.jsonl", "tasks.jsonl", "labels.jsonl"):
        old.claim(output, True)
    assert json.loads((tmp_path / "settings.json").read_text())["tasks.jsonl"]["domain.options.max_operand"] == 100

    (tmp_path / "settings.json").write_text(json.dumps({"probes": settings_of("probes", plain, {}, soft)}))
    with pytest.raises(PropelError, match=r"reward.options.soft.clip_low: 0.3 -> 0.1"):
        run().claim("probes", True, soft)  # clip_low set then, its default (0.1) now


def test_propel_config_shows_every_components_defaults_and_what_registered_it(propel_cli, tmp_path):
    """`propel config` says, as comments after the config, the options of the components it names that
    are left at their defaults (the rule in use too) and which distribution registered each; what it
    prints reads back as the same config, and still takes an override that names another component."""
    (tmp_path / "c.yaml").write_text("domain: {name: azr}\nreward: {rule: soft}\n")
    shown = propel_cli("config", str(tmp_path / "c.yaml")).stdout
    assert "#   reward.options.soft.clip_low: 0.1\n#   reward.options.soft.clip_high: 0.95\n" in shown
    assert "#   domain.options.sandbox_options.memory_mb: 512\n" in shown
    assert "#   domain.name: azr: propel-azr " in shown and "#   reward.rule: soft: propel-core " in shown
    (tmp_path / "shown.yaml").write_text(shown)
    assert propel_cli("config", str(tmp_path / "shown.yaml")).stdout == shown
    other = propel_cli("config", str(tmp_path / "shown.yaml"), "generate.context_sampler=progress").stdout
    assert "generate.context_sampler: progress: propel-core " in other
