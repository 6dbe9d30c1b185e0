"""``propel rounds`` end to end on the embedded model at a tiny size: two rounds, each training the
generator against the round's probe, the solver on the probe's in-band tasks, labeling a sample with
both solvers and refitting the probe; killed mid-round and rerun, it writes what an uninterrupted run
writes, and a changed setting is refused."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from propel_core.config import ConfigError
from propel_core.domain import make_task
from propel_core.plans import round_plan, validate_config
from propel_core.plugins import Registry
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, iter_jsonl
from propel_core.testing import digests, kill_when_written

SMALL = "small/arithmetic"  # the built-in config, found by name
#: two rounds of a few tasks each; a training step takes tens of seconds here, so one step each
ROUNDS = [
    "rounds.num_rounds=2",
    "rounds.tasks=24",
    "rounds.label_budget=4",
    "rounds.min_solver_tasks=2",
    "rounds.held_out_tasks=4",
    "train.steps=1",
    "solve_train.steps=1",
    "solve_train.group_size=2",
    "solve_train.per_device_batch=4",
    "solve_train.max_completion_length=16",
    "solve_train.eval_k=4",
    "checkpoint.every=1",
    "train.audit.every=0",
]


def test_each_round_starts_from_the_last_ones_adapters_and_probe_and_shows_its_trace(tmp_path):
    config = validate_config({"run_dir": str(tmp_path), "domain": {"name": "arithmetic"}, "rounds": {"trace": True}})
    last = tmp_path / "rounds" / "r1"
    plan = round_plan(config, 2, last / "probe", last / "train" / "adapter", last / "solve" / "adapter")
    assert plan.folder == tmp_path / "rounds" / "r2" and plan.seed != round_plan(config, 1).seed
    assert plan.train.reward.main_probe == str(last / "probe")
    assert plan.train.generator.adapter == str(last / "train" / "adapter")
    assert plan.solve.solver.adapter == str(last / "solve" / "adapter")  # trained on from the last round's
    assert plan.previous.solver.adapter == str(last / "solve" / "adapter")  # the solver it starts from
    assert plan.labels.solver.adapter == str(plan.folder / "solve" / "adapter")  # the one it trains
    assert plan.tasks == plan.train.contexts and plan.tasks.name == "trace"
    assert plan.tasks.options == {"inner": "uniform", "inner_options": {}, "trace": str(last / "labels.jsonl")}
    assert round_plan(config, 1).tasks.options["trace"] == str(tmp_path / "labels.jsonl")  # the corpus's
    assert (
        round_plan(config.model_copy(update={"rounds": config.rounds.model_copy(update={"trace": False})})).tasks.name
        == "uniform"
    )


def test_a_trace_around_a_sampler_it_cannot_wrap_is_refused_when_the_config_is_read(tmp_path):
    registry = Registry.build()
    domain = registry.domain("arithmetic")
    task = make_task(
        "t000000", domain, domain.contexts()[0], "Compute: 2 + 3", "m", registry.validity_predicates(domain)
    )
    attempts = [SolverAttempt(text="", solved=j < 1) for j in range(4)]
    with JsonlWriter(tmp_path / "tasks.jsonl") as tasks, JsonlWriter(tmp_path / "labels.jsonl") as written:
        tasks.write(task)
        written.write(Label.from_attempts(task.id, attempts, (0.25, 0.5), 1))
    labels = tmp_path / "labels.jsonl"
    data = {
        "run_dir": str(tmp_path),
        "domain": {"name": "arithmetic"},
        "rounds": {"trace": True},
        "generate": {"context_sampler": "trace", "sampler_options": {"trace": str(labels)}},
    }
    with pytest.raises(ConfigError, match=r"rounds\.trace wraps generate\.context_sampler"):
        validate_config(data)


@pytest.fixture
def probed(tmp_path_factory, propel_cli):
    """small/arithmetic's corpus, labels, activations and probe (no training): where rounds start."""
    folder = tmp_path_factory.mktemp("rounds") / "run"
    for stage in ("generate", "label", "extract", "probe"):
        propel_cli("-q", stage, SMALL, f"run_dir={folder}", *ROUNDS)
    return folder


@pytest.mark.slow
def test_two_rounds_resume_after_kill_9_and_repeat_from_the_seed(probed, propel_cli, tmp_path):
    first = tmp_path / "run"  # both runs write here: what they record names their run_dir
    shutil.copytree(probed, first)
    result = propel_cli("-q", "rounds", SMALL, f"run_dir={first}", *ROUNDS)
    rounds = first / "rounds"
    for number in (1, 2):
        folder = rounds / f"r{number}"
        summary = json.loads((folder / "round.json").read_text())
        assert summary["round"] == number
        for name in ("train/adapter", "solve/adapter", "probe/probe.json", "held_out.json", "tasks.jsonl"):
            assert (folder / name).exists(), name
        # the solver trained on none of the labeled sample and none of the held-out tasks
        labeled = {label.task_id for label in iter_jsonl(folder / "labels.jsonl", Label)}
        trained_on = set(json.loads((folder / "solver_tasks.json").read_text())["ids"])
        assert labeled and trained_on and not labeled & trained_on
        held_out = [task.text for task in iter_jsonl(first / "tasks.jsonl", Task) if task.validity.valid][:4]
        texts = {task.id: task.text for task in iter_jsonl(folder / "tasks.jsonl", Task)}
        assert not {texts[i] for i in trained_on} & set(held_out)
        # both solvers labeled the same sample; the attempts spent add up
        previous = {label.task_id for label in iter_jsonl(folder / "labels_previous.jsonl", Label)}
        assert previous == labeled
        spent = summary["solver_attempts"]
        assert spent["labels"] == spent["labels_previous"] == 4 * len(labeled)
        assert spent["solver_training"] == 4 and spent["held_out"] == 4 * 4
        assert spent["total"] == sum(value for key, value in spent.items() if key != "total")
        low, high = summary["held_out"]["ci95"]
        assert 0 <= low <= summary["held_out"]["metrics"]["average_score"] <= high <= 1
    # round 2 starts from round 1's adapters and trains against round 1's refitted probe
    assert json.loads((rounds / "r2" / "round.json").read_text())["probe"] == "rounds/r1/probe"
    config = json.loads((rounds / "r2" / "solve" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 16  # the lora section's, carried on from round 1's adapter
    assert "r1  held-out score" in result.stdout and "r2  held-out score" in result.stdout

    # the same seed, killed while round 2's generator writes its tasks, then rerun: the same bytes
    expected = digests(first)
    shutil.move(first, tmp_path / "first")
    again = tmp_path / "run"
    shutil.copytree(probed, again)
    command = [str(Path(sys.executable).with_name("propel")), "-q", "rounds", SMALL, f"run_dir={again}", *ROUNDS]
    kill_when_written(command, again / "rounds" / "r2" / "tasks.jsonl", lines=3, timeout=1800)
    assert not (again / "rounds" / "r2" / "round.json").exists()
    propel_cli("-q", "rounds", SMALL, f"run_dir={again}", *ROUNDS)
    found = digests(again)
    assert sorted(found) == sorted(expected)
    assert [name for name in sorted(found) if found[name] != expected[name]] == []

    # a setting a round depends on, changed, is refused before anything runs
    refused = propel_cli("rounds", SMALL, f"run_dir={again}", *ROUNDS, "rounds.old_weight=0.9", check=False)
    assert refused.returncode != 0 and "rounds.old_weight: 0.5 -> 0.9" in refused.stderr

    # the report draws the rounds
    propel_cli("-q", "report", SMALL, f"run_dir={again}", *ROUNDS)
    page = (again / "report.html").read_text()
    assert "Rounds: does the solver learn" in page and "alt='held-out score and in-band rate per round'" in page
