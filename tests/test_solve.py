"""Solver training on generated tasks (a real RLOO run with LoRA) and verifier-filtered self-training."""

import json

import pytest

from propel_core.domain import make_task
from propel_core.errors import PropelError
from propel_core.evaluation import solver_metrics
from propel_core.plans import validate_config
from propel_core.records import JsonlWriter, Label, SolverAttempt
from propel_core.run import Run
from propel_core.stages.solve import self_train, solve_train

pytestmark = pytest.mark.slow

EASY = ["2 + 2", "3 + 4", "6 * 7", "12 + 7", "7 * 8", "5 + 5"]
HELD_OUT = ["4 + 4", "2 + 3", "9 * 2", "10 + 10", "15 * 4", "8 - 3"]


@pytest.fixture(scope="module")
def solve_run(tmp_path_factory):
    from propel_core.plugins import Registry

    registry = Registry.build()
    folder = tmp_path_factory.mktemp("solve-run")
    domain = registry.domain("arithmetic")
    predicates = registry.validity_predicates(domain)

    def write(path, expressions, with_labels):
        path.mkdir(parents=True, exist_ok=True)
        with JsonlWriter(path / "tasks.jsonl") as tasks, JsonlWriter(path / "labels.jsonl") as labels:
            for i, expression in enumerate(expressions):
                task = make_task(f"t{i:06d}", domain, domain.contexts()[0], f"Compute: {expression}", "m", predicates)
                tasks.write(task)
                if with_labels:  # the first four are "in band", the rest not
                    attempts = [SolverAttempt(text="", solved=j < (2 if i < 4 else 8)) for j in range(8)]
                    labels.write(Label.from_attempts(task.id, attempts, (1 / 8, 3 / 8), 1))

    write(folder / "eval" / "trained", EASY, with_labels=True)
    write(folder, HELD_OUT, with_labels=False)
    data = {
        "run_dir": str(folder),
        "domain": {"name": "arithmetic"},
        "solver": {"batch_size": 8, "sampling": {"temperature": 0.8, "max_new_tokens": 8}},
        "solve_train": {
            "steps": 2,
            "group_size": 4,
            "per_device_batch": 8,
            "max_completion_length": 8,
            "eval_k": 4,
            "held_out_tasks": 4,
            "lr": 1e-4,
        },
        "self_train": {"tasks": "eval/trained/tasks.jsonl", "k": 4, "steps": 1, "batch_size": 2, "per_task_cap": 1},
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def test_rloo_trains_the_solver_adapter_and_evaluates_both_arms(solve_run):
    from safetensors.torch import load_file

    solve_train(solve_run)
    folder = solve_run.dir / "solve" / "trained-tasks"
    adapter = load_file(folder / "adapter" / "adapter_model.safetensors")
    assert any(value.abs().sum() > 0 for name, value in adapter.items() if "lora_B" in name)  # it trained
    metrics = json.loads((folder / "metrics.json").read_text())
    per_prompt = json.loads((folder / "per_prompt.json").read_text())
    assert per_prompt["held_out"] == [f"Compute: {e}" for e in HELD_OUT[:4]]  # the first held_out_tasks of the file
    for arm in ("base", "trained"):
        assert metrics["arms"][arm] == pytest.approx(solver_metrics(per_prompt["counts"][arm], 4))
        assert set(metrics["arms"][arm]) == {"average_score", "pass@1", "pass@4", "zero_success_rate"}
    comparison = metrics["comparisons"]["trained_vs_base"]
    assert comparison["wins"] + comparison["losses"] + comparison["ties"] == 4
    # a second run on the not-in-band tasks compares itself with the first, prompt by prompt
    other = solve_run.config.model_dump(mode="json")
    other["solve_train"] |= {
        "name": "all-tasks",
        "in_band_only": False,
        "baseline": "trained-tasks",
        "context_sampler": "progress",
        "sampler_options": {"buckets": "prompt"},
    }
    solve_train(Run(validate_config(other, solve_run.registry), solve_run.registry, quiet=True))
    second = json.loads((solve_run.dir / "solve" / "all-tasks" / "metrics.json").read_text())
    assert set(second["comparisons"]) == {"trained_vs_base", "trained_vs_trained-tasks"}
    # the progress sampler saw the verifier's rewards of every step
    steps = (solve_run.dir / "solve" / "all-tasks" / "reward_log.jsonl").read_text().splitlines()
    assert len(steps) == 2 and json.loads(steps[-1])["sampler"]["buckets_with_data"] >= 2
    assert [json.loads(step)["source"] for step in steps] == ["verifier", "verifier"]


def test_a_step_of_partial_groups_is_refused_before_the_solver_loads(solve_run):
    """A generation batch that is not whole groups (TRL refuses it with a ValueError, after the model
    has loaded) is one line naming both settings, and the folder holds no adapter."""
    other = solve_run.config.model_dump(mode="json")
    other["solve_train"] |= {"name": "partial", "per_device_batch": 6}  # group_size 4
    with pytest.raises(PropelError, match=r"solve_train.per_device_batch \(6\) x 1 process\(es\) must be a multiple"):
        solve_train(Run(validate_config(other, solve_run.registry), solve_run.registry, quiet=True))
    assert not (solve_run.dir / "solve" / "partial" / "adapter").exists()


def test_solver_metrics_by_hand():
    metrics = solver_metrics([0, 2, 4], 4)
    assert metrics["average_score"] == pytest.approx(0.5)
    assert metrics["pass@1"] == pytest.approx(0.5) and metrics["zero_success_rate"] == pytest.approx(1 / 3)
    assert metrics["pass@4"] == pytest.approx(2 / 3)  # every attempt drawn: pass iff any success


def test_self_training_filters_and_fine_tunes(solve_run):
    self_train(solve_run)
    report = json.loads((solve_run.dir / "self_train" / "filter_report.json").read_text())
    counts = list(report["funnel"].values())
    assert counts[0] == len(EASY) * 4 and counts == sorted(counts, reverse=True)  # each filter keeps a subset
    assert report["self_rows"] == report["funnel"]["after per-task cap"] <= len(EASY)  # at most 1 per task
    assert (solve_run.dir / "self_train" / "adapter" / "adapter_model.safetensors").exists()


def test_grpo_drops_and_rloo_refills_the_groups_of_one_reward_when_asked(solve_run):
    """solve_train.zero_variance on real runs. GRPO with drop: every step's share of completions left
    out of the loss (TRL's log) is its share of groups of one reward (the reward log). RLOO with refill:
    every step's reward log entry says how many of its groups were flat, and of those how many further
    draws of prompts refilled and how many were dropped, as TRL's log does; the further draws' rollouts
    are graded and written like the step's own."""
    other = solve_run.config.model_dump(mode="json")
    other["solve_train"] |= {"name": "dropping", "algorithm": "grpo", "zero_variance": "drop"}
    solve_train(Run(validate_config(other, solve_run.registry), solve_run.registry, quiet=True))
    folder = solve_run.dir / "solve" / "dropping"
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    logged = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    dropped = [entry["zero_variance/dropped"] for entry in logged if "zero_variance/dropped" in entry]
    assert dropped == pytest.approx([step["degenerate_groups"] for step in steps]) and len(dropped) == 2

    other["solve_train"] |= {"name": "refilling", "algorithm": "rloo", "zero_variance": "refill", "max_refills": 2}
    solve_train(Run(validate_config(other, solve_run.registry), solve_run.registry, quiet=True))
    folder = solve_run.dir / "solve" / "refilling"
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    logged = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    refilled = [entry["zero_variance/refilled"] for entry in logged if "zero_variance/refilled" in entry]
    assert [step["step"] for step in steps] == [0, 1] and len(refilled) == 2
    for step, refills in zip(steps, refilled, strict=True):
        counts = step["zero_variance"]
        assert counts["flat"] == round(step["degenerate_groups"] * 2)  # 8 rollouts a step, groups of 4
        assert counts["refilled"] + counts["dropped"] == counts["flat"] and counts["refilled"] == refills
        assert len(counts["draws"]) <= 2 and (counts["draws"] or not counts["flat"])
    drawn = sum(len(step["zero_variance"]["draws"]) for step in steps)
    rollouts = (folder / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) >= 16 + 4 * drawn  # each further draw: at least one group of 4, graded
