"""train.audit on a real tiny training: GRPO steps of the embedded generator on arithmetic tasks, the
reward from a real probe bundle, and audits labeled by the simulated ``arithmetic_skill`` solver
through the executor (local threads, and the two-node Ray test cluster)."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from propel_core.execution import label_tasks
from propel_core.plans import label_plan, validate_config
from propel_core.plugins import Registry
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run
from propel_core.stages.train import train

pytestmark = pytest.mark.slow

STEPS = 3


@pytest.fixture(scope="module")
def bundle(planted_probe):
    """A probe bundle (countdown tasks with a planted label): the reward of every training here."""
    return planted_probe / "probes" / "selected"


def settings(folder: Path, bundle: Path, **audit) -> dict:
    return {
        "run_dir": str(folder),
        "domain": {"name": "arithmetic"},
        "solver": {"backend": "arithmetic_skill"},
        "reward": {"main_probe": str(bundle)},
        "train": {
            "steps": STEPS,
            "group_size": 2,
            "per_device_batch": 4,
            "gradient_accumulation": 1,
            "max_completion_length": 12,
            "gradient_checkpointing": False,
            "audit": {"every": 1, "tasks": 3, "k": 4, **audit},
        },
        "checkpoint": {"every": 1},
    }


def trained(folder: Path, bundle: Path, executor=None, **audit) -> Run:
    registry = Registry.build()
    data = settings(folder, bundle, **audit) | ({"executor": executor} if executor else {})
    run = Run(validate_config(data, registry), registry, quiet=True)
    train(run)
    return run


def records(run: Run) -> list[dict]:
    return records_in(run.dir / "train")


def records_in(folder: Path) -> list[dict]:
    return sorted(
        (json.loads(line) for line in (folder / "audit.jsonl").read_text().splitlines()), key=lambda r: r["step"]
    )


@pytest.fixture(scope="module")
def audited(tmp_path_factory, bundle):
    return trained(tmp_path_factory.mktemp("audited"), bundle)


def test_an_audit_of_every_step_with_the_label_stages_labels(audited, tmp_path):
    found = records(audited)
    assert sorted(r["step"] for r in found) == list(range(STEPS))
    tasks = list(iter_jsonl(audited.dir / "train" / "audit" / "tasks.jsonl", Task))
    assert [t.id.split("-")[1] for t in tasks].count("0") == 3  # the sample's size, from each step
    labels = {label.task_id: label for label in iter_jsonl(audited.dir / "train" / "audit" / "labels.jsonl", Label)}
    plan = label_plan(audited.config, k=4)
    valid = [task for task in tasks if task.validity.valid]
    again = label_tasks(audited.services, valid, tmp_path / "labels.jsonl", plan)  # as the label stage labels them
    assert labels and {label.task_id: label for label in again} == labels
    for record in found:
        assert record["trials"] == 4 * sum(
            1 for t in tasks if t.validity.valid and t.id.startswith(f"rl-{record['step']}-")
        )
        assert 0 <= record["valid_rate"] <= 1 and record["seconds"] >= 0
        if record["in_band_rate"] is not None:
            assert record["gap"] == pytest.approx(record["probe_probability"] - record["in_band_rate"])


def test_the_policy_stops_where_generate_stops(audited):
    """TRL's generation stops at the arithmetic domain's line end, as the backends do in generate
    (transformers reads a stop string with the tokenizer, which TRL does not pass; generate would
    raise without it), and the logged tasks end before it."""
    folder = audited.dir / "train"
    logged = [json.loads(line) for line in (folder / "completions.jsonl").read_text().splitlines()]
    generations = [completion["generation"] for entry in logged for completion in entry["completions"]]
    assert generations and not any("\n" in generation for generation in generations)
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert len(steps) == STEPS and all(0 <= step["cut_off"] < 1 for step in steps)


def test_the_best_audited_adapter_is_the_one_kept(audited):
    found = records(audited)
    utilities = [r["utility"] for r in sorted(found, key=lambda r: r["step"])]
    best = json.loads((audited.dir / "train" / "best_audited" / "audit.json").read_text())
    assert best["utility"] == max(utilities) and best["step"] == utilities.index(max(utilities))
    assert (audited.dir / "train" / "best_audited" / "adapter_model.safetensors").exists()
    assert not list((audited.dir / "train" / "audit").glob("step-*"))  # snapshots go once audited


def test_a_stop_rule_stops_training_with_one_line(tmp_path, bundle, capsys):
    registry = Registry.build()
    data = settings(tmp_path, bundle, stop_gap=0.001, stop_after=1)
    data["train"]["steps"] = 12
    run = Run(validate_config(data, registry), registry, quiet=False)
    train(run)
    steps = [json.loads(line) for line in (tmp_path / "train" / "log.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "step_time" in s]) < 12  # stopped early
    said = capsys.readouterr().out
    assert "training stopped after step" in said and "audit.stop_gap=0.001" in said
    from propel_core.stages.report import banner_section, stage_states  # the report's banner says so too

    train_line = banner_section(stage_states(run)).split("<b>train</b>: ", 1)[1].split("</li>", 1)[0]
    assert train_line.startswith("stopped at step ") and " of 12 by an audit&#x27;s stop rule" in train_line
    assert train_line.endswith("to start over: <code>propel train CONFIG checkpoint.resume=false</code>")


def test_kill_9_and_resume_neither_lose_nor_repeat_an_audit(tmp_path, bundle, propel_cli):
    import yaml

    from propel_core.testing import kill_when_written

    (tmp_path / "run.yaml").write_text(yaml.safe_dump(json.loads(json.dumps(settings(tmp_path, bundle)))))
    command = [str(Path(sys.executable).with_name("propel")), "-q", "train", str(tmp_path / "run.yaml")]
    kill_when_written(command, tmp_path / "train" / "audit.jsonl", lines=2)
    propel_cli("-q", "train", str(tmp_path / "run.yaml"))
    found = [json.loads(line) for line in (tmp_path / "train" / "audit.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in found) == list(range(STEPS))
    ids = [t.id for t in iter_jsonl(tmp_path / "train" / "audit" / "tasks.jsonl", Task)]
    assert len(ids) == len(set(ids)) == 3 * STEPS
    labels = [label.task_id for label in iter_jsonl(tmp_path / "train" / "audit" / "labels.jsonl", Label)]
    assert len(labels) == len(set(labels))


def test_evaluate_can_take_the_best_audited_adapter(audited):
    from propel_core.stages.evaluate import adapters

    config = audited.config.model_copy(
        update={"evaluate": audited.config.evaluate.model_copy(update={"adapter": "best_audited"})}
    )
    run = Run(config, audited.registry, quiet=True)
    assert adapters(run)["trained"] == audited.dir / "train" / "best_audited"


def test_coevolve_mines_the_audited_rows(audited):
    """With no evaluation yet, the audits' labeled tasks are the rows adversarial co-evolution mines."""
    from propel_core.stages.coevolve import policy_rows

    tasks, labels = policy_rows(audited)
    audited_ids = {label.task_id for label in iter_jsonl(audited.dir / "train" / "audit" / "labels.jsonl", Label)}
    assert {task.id for task in tasks} == set(labels) == audited_ids


def test_the_report_plots_the_audits_beside_the_probe(audited):
    from propel_core.stages.report import report

    report(audited)
    page = (audited.dir / "report.html").read_text()
    assert "Audits: the real solver on the policy's own tasks" in page
    assert (audited.dir / "train" / "audit.png").stat().st_size > 0


# -- the audit's own files, on real small pieces: the simulated solver through the executor, and a
# -- tiny random Llama with a LoRA adapter as the policy whose adapter is kept --------------------


@pytest.fixture
def small(tmp_path):
    """A run (arithmetic tasks, the simulated solver), a policy with a LoRA adapter, and tasks of
    steps 0..3: easy ones at even steps, hard ones (in band most often) at odd steps."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from propel_core.domain import make_task

    registry = Registry.build()
    data = {"run_dir": str(tmp_path), "domain": {"name": "arithmetic"}, "solver": {"backend": "arithmetic_skill"}}
    run = Run(validate_config(data, registry), registry, quiet=True)
    torch.manual_seed(0)
    tiny = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    policy = get_peft_model(LlamaForCausalLM(tiny), LoraConfig(r=2, target_modules=["q_proj"]))
    domain, context = run.domain(), run.domain().contexts()[0]
    predicates = registry.validity_predicates(domain)
    exercises = {0: ["3 + 4", "5 + 2", "1 + 1", "2 + 6"], 1: ["23 * 45", "31 * 17", "27 * 14", "19 * 36"]}
    steps = {
        step: [
            make_task(f"rl-{step}-{i}", domain, context, f"Compute: {e}", "policy", predicates)
            for i, e in enumerate(exercises[step % 2])
        ]
        for step in range(4)
    }
    return run, policy, steps


def audit_of(run, folder, **options):
    from propel_core.config import AuditConfig
    from propel_core.plans import AuditPlan
    from propel_core.training import audit

    plan = AuditPlan(AuditConfig(every=1, tasks=4, **options), replace(run.plans.label, description="audit"))
    return audit.audit_of(run.services, folder, plan)


def audit_steps(audit, policy, steps, upto: int, probability: float = 0.5):
    for step in range(upto):
        audit.snapshot(step, policy)
        audit.offer(step, steps[step], [probability] * len(steps[step]))


def audited_folder(small, tmp_path, upto: int) -> Path:
    """``train/`` after audits of steps 0..upto-1, all finished."""
    run, policy, steps = small
    audit = audit_of(run, tmp_path / "train")
    audit.start(0)
    audit_steps(audit, policy, steps, upto)
    audit.close()
    return tmp_path / "train"


def test_audits_through_the_ray_executor_equal_local_ones(small, tmp_path, propel_ray_cluster):
    run, policy, steps = small
    data = run.config.model_dump(mode="json") | {"executor": {"name": "ray", "workers": 4}}
    on_ray = Run(validate_config(data, run.registry), run.registry, quiet=True)
    assert type(on_ray.executor()).__name__ == "RayExecutor"
    folders = [
        audited_folder(small, tmp_path / "local", 2),
        audited_folder((on_ray, policy, steps), tmp_path / "ray", 2),
    ]
    found = [
        sorted(iter_jsonl(folder / "audit" / "labels.jsonl", Label), key=lambda label: label.task_id)
        for folder in folders
    ]
    assert len(found[0]) == 8 and found[0] == found[1]  # two steps' 4 tasks
    utilities = [[(r["step"], r["utility"]) for r in records_in(folder)] for folder in folders]
    assert utilities[0] == utilities[1]


def test_a_resume_drops_the_best_of_a_redone_step_and_reads_past_torn_lines(small, tmp_path):
    folder = audited_folder(small, tmp_path, 4)
    best = json.loads((folder / "best_audited" / "audit.json").read_text())
    assert best["step"] == 1 and not list((folder / "audit").glob("step-*"))  # a hard step, the first best
    for path in (folder / "audit.jsonl", folder / "audit" / "tasks.jsonl", folder / "audit" / "labels.jsonl"):
        with path.open("a") as handle:
            handle.write('{"step": 9, "torn')  # a kill mid-line
    again = audit_of(small[0], folder)
    again.start(1)  # training goes on from checkpoint-1: steps 1.. are redone
    again.close()
    assert [r["step"] for r in again.records] == [0] and not (folder / "best_audited").exists()
    assert {_step(t.id) for t in iter_jsonl(folder / "audit" / "tasks.jsonl", Task)} == {0}


def test_an_audit_killed_before_its_record_runs_again_whole(small, tmp_path):
    folder = audited_folder(small, tmp_path, 2)
    lines = (folder / "audit.jsonl").read_text().splitlines()
    (folder / "audit.jsonl").write_text(lines[0] + "\n")  # step 1's labels were written, its record not
    again = audit_of(small[0], folder)
    again.start(2)
    again.close()
    assert sorted(r["step"] for r in again.records) == [0, 1]
    labels = [label.task_id for label in iter_jsonl(folder / "audit" / "labels.jsonl", Label)]
    assert len(labels) == len(set(labels)) == 8


def test_a_failed_audit_is_recorded_and_training_goes_on(small, tmp_path):
    from propel_core.config import AuditConfig
    from propel_core.training.audit import Audit, read_records

    _, policy, steps = small

    def down(tasks):
        raise ConnectionError("the solver's server is down")

    audit = Audit(AuditConfig(every=1, tasks=4), tmp_path / "train", down, 0)
    audit.start(0)
    audit_steps(audit, policy, steps, 2)
    audit.close()  # does not raise
    assert [r.get("error") for r in read_records(tmp_path / "train")] == [
        "ConnectionError: the solver's server is down"
    ] * 2


def test_a_stop_met_before_the_checkpoint_still_holds(small, tmp_path):
    run, policy, steps = small
    folder = tmp_path / "train"
    audit = audit_of(run, folder, stop_gap=0.3, stop_after=1)
    audit.start(0)
    audit_steps(audit, policy, steps, 3, probability=0.95)  # the probe says in band; easy steps are not
    audit.close()
    assert audit.stop_reason
    again = audit_of(run, folder, stop_gap=0.3, stop_after=1)
    again.start(3)
    again.close()
    assert again.stop_reason == audit.stop_reason


def test_an_audit_counts_the_k_the_probe_learned_unless_told(small):
    from propel_core.errors import PropelError
    from propel_core.plans import generator_plan, validate_config

    run, _, _ = small
    data = run.config.model_dump(mode="json")
    data["train"]["audit"] = {"every": 1}
    assert generator_plan(validate_config(data)).audit.labels.label.k == run.config.label.k
    data["train"]["audit"]["k"] = 3
    assert generator_plan(validate_config(data)).audit.labels.label.k == 3
    for section, k in (("train", {"audit": {"k": 4}}), ("evaluate", {"k": 4})):  # when the config is read
        setting = f"{section}.{'audit.' if section == 'train' else ''}k"
        with pytest.raises(PropelError, match=rf"{setting} \(4\) is below label.min_valid_attempts \(6\)"):
            validate_config({"domain": {"name": "arithmetic"}, "label": {"min_valid_attempts": 6}, section: k})


def _step(task_id: str) -> int:
    return int(task_id.split("-")[1])


def test_masking_truncated_completions_beside_stop_strings_is_refused(tmp_path, bundle):
    """TRL takes a completion that ended on a stop string for a truncated one (no end token): with the
    arithmetic domain's line end, train.mask_truncated_completions is refused in one line, before any
    model loads."""
    from propel_core.errors import PropelError

    registry = Registry.build()
    data = settings(tmp_path, bundle)
    data["train"] |= {"mask_truncated_completions": True}
    run = Run(validate_config(data, registry), registry, quiet=True)
    with pytest.raises(PropelError, match=r"train.mask_truncated_completions takes a completion that ended on a stop"):
        train(run)
    assert not (tmp_path / "train" / "adapter").exists()


def test_an_audit_says_its_figures_in_three_decimals_and_why_one_is_missing():
    """The progress line of an audit (issue 60's trial printed ``calibration gap 0.3370174914598465``,
    and ``None`` where nothing was probed)."""
    from propel_core.training.audit import audit_line

    measured = {"step": 3, "utility": 0.25, "gap": 0.3370174914598465, "auroc": 0.71234}
    assert audit_line(measured) == "audit of step 3: utility 0.250, calibration gap +0.337, AUROC 0.712"
    nothing_valid = {"step": 0, "utility": 0.0, "gap": None, "auroc": None}
    assert audit_line(nothing_valid) == (
        "audit of step 0: utility 0.000, calibration gap n/a, AUROC n/a (no audited tasks on both sides of the band)"
    )
