"""solve-train on the MLE domain with the embedded model: rewards from real sandboxed executions (seed
002's partial instrumentation, replay), and RM-GRPO switching reward source on schedule."""

import json

import pytest

from propel_core.domain import grade_attempt
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.records import JsonlWriter, Label, SolverAttempt, Task, Validity, iter_jsonl
from propel_core.run import Run
from propel_core.stages.solve import solve_train
from propel_mle.plugin import TASKS, solution

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def registry():
    registry = Registry.build()
    if not registry.domain("mle").sandbox.isolated:
        pytest.skip("the MLE environment runs solutions only with every isolation layer")
    return registry


def shipped(domain, i):
    """Shipped task ``i`` as a valid task (its bar is checked by test_tasks.py, not here)."""
    payload = TASKS[i]
    return Task(
        id=f"mle-{i:03d}",
        domain="mle",
        context_id="mle-000",
        generation=domain.render(payload),
        generator="shipped",
        payload=payload,
        text=domain.render(payload),
        topic=domain.topic(payload),
        validity=Validity.ok(),
    )


def mle_run(folder, registry, **solve_train):
    """A run on three shipped tasks (the first held out), written without running the reference."""
    domain = registry.domain("mle")
    path = folder / "mle" / "tasks.jsonl"
    if not path.exists():
        with JsonlWriter(path) as out:
            for i in range(3):
                out.write(shipped(domain, i))
    data = {
        "run_dir": str(folder),
        "domain": {"name": "mle", "options": {"time_limit": 30.0}},
        "executor": {"workers": 2},
        "solver": {"batch_size": 4, "sampling": {"temperature": 1.0, "max_new_tokens": 40}},
        "checkpoint": {"resume": False},
        "solve_train": {
            "tasks": "mle/tasks.jsonl",
            "held_out": "mle/tasks.jsonl",
            "in_band_only": False,
            "held_out_tasks": 1,
            "algorithm": "grpo",
            "steps": 2,
            "group_size": 2,
            "per_device_batch": 2,
            "max_completion_length": 40,
            "eval_k": 1,
            "lr": 1e-4,
            "reward_rule": "partial_instrumentation",
            **solve_train,
        },
    }
    return Run(validate_config(data, registry), registry, quiet=True)


def planted_ranker(folder, registry):
    """A calibrated ranker from solutions of graded quality (scores planted, texts real solutions)."""
    domain = registry.domain("mle")
    out = folder / "planted"
    with JsonlWriter(out / "tasks.jsonl") as tasks, JsonlWriter(out / "labels.jsonl") as labels:
        for i in (1, 2):
            task, payload = shipped(domain, i), TASKS[i]
            tasks.write(task)
            good = "```python\n" + solution(payload) + "```"
            weaker = good.replace("n_estimators=200", "n_estimators=2")
            broken = "```python\nimport pandas as pd\ntrain = pd.read_csv('train.csv')\n```"
            attempts = [
                SolverAttempt(text=text, solved=score is not None, diagnostics={"verifier_score": score})
                for text, score in ((good, 0.95), (weaker, 0.8), (broken, None), (good + "\n", 0.94))
            ]
            labels.write(Label.from_attempts(task.id, attempts, (0.1, 0.9), 1))
    data = {
        "run_dir": str(folder),
        "domain": {"name": "mle"},
        "rank": {"items": "attempts", "labels": "planted/labels.jsonl", "epochs": 5},
    }
    from propel_core.stages.rank import rank

    rank(Run(validate_config(data, registry), registry, quiet=True))
    return folder / "ranker"


def test_rm_grpo_switches_reward_source_on_schedule_and_verified_rewards_come_from_real_executions(tmp_path, registry):
    """Three steps of RM-GRPO (verifier, reward model, verifier) with replay: verified rewards are what
    the rule makes of what each sandboxed execution reached, the model step runs nothing, and the
    trained solver is evaluated on the held-out task."""
    ranker = planted_ranker(tmp_path, registry)
    replay = {"strategy": "top_k", "min_reward": -9.95, "comparison": ">"}
    run = mle_run(tmp_path, registry, steps=3, reward_model=str(ranker), verifier_steps=1, model_steps=1, replay=replay)
    solve_train(run)
    folder = tmp_path / "solve" / "trained-tasks"
    steps = [json.loads(line) for line in (folder / "reward_log.jsonl").read_text().splitlines()]
    assert [step["source"] for step in steps] == ["verifier", "reward_model", "verifier"]
    assert [step["verifier_calls"] for step in steps] == [2, 2, 4]
    assert [step["verifier_calls_saved"] for step in steps] == [0, 2, 2]
    assert "valid_rate" in steps[0] and "valid_rate" not in steps[1]  # nothing ran on the model step
    for step in steps[::2]:  # a verifier step's valid-submission rate and score
        assert 0 <= step["valid_rate"] <= 1 and "verifier_score_mean" in step
    assert all(step["seconds_per_rollout"] > 0 and "replay_admitted" in step for step in steps)
    rollouts = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    assert [sum(row["step"] == step for row in rollouts) for step in range(3)] == [2, 2, 2]
    by_step = {step: {row["source"] for row in rollouts if row["step"] == step} for step in range(3)}
    assert by_step[0] == by_step[2] == {"verifier"} and by_step[1] <= {"reward_model", "not run"}
    for row in rollouts:
        if row["source"] == "verifier":  # each reward is what the rule makes of what the execution reached
            expected = row["verifier_score"] if row["verifier_score"] is not None else -10 + 0.1 * len(row["markers"])
            assert row["reward"] == pytest.approx(expected) and row["duration"] is not None
        if row["source"] == "not run":  # did not look valid: the partial reward of no marker
            assert row["reward"] == pytest.approx(-10) and row["markers"] is None
    # only verified rollouts make the corpus a ranker is refreshed on
    labels = list(iter_jsonl(folder / "verified" / "labels.jsonl", Label))
    assert sum(len(label.attempts) for label in labels) == 4
    per_prompt = json.loads((folder / "per_prompt.json").read_text())  # evaluated on the held-out task
    assert per_prompt["held_out"] == [registry.domain("mle").render(TASKS[0])] and per_prompt["k"] == 1


def test_a_model_step_scores_what_looks_valid_with_the_calibrated_ranker(tmp_path, registry):
    """RM-GRPO's two steps on the same planted rollouts: the verifier runs both on step 0; on step 1
    nothing runs, the valid-looking script gets the ranker's calibrated score, the other -10."""
    from propel_core.config import RewardConfig
    from propel_core.probes.bundles import load_probe
    from propel_core.training.solver_reward import SolverRewards
    from propel_plugins.rewards import partial_instrumentation

    ranker = load_probe(planted_ranker(tmp_path, registry), registry)
    domain = registry.domain("mle")
    task = shipped(domain, 1)  # wine f1
    graded = []

    def grade(attempts):
        graded.extend(attempts)
        return [grade_attempt(domain, task, text) for task, text in attempts]

    rewards = SolverRewards(
        domain,
        [task],
        grade,
        tmp_path,
        rule=partial_instrumentation(RewardConfig()),
        reward_model=ranker,
        verifier_steps=1,
        model_steps=1,
    )
    good = "```python\n" + solution(TASKS[1]) + "```"
    unfinished = "```python\nimport pandas as pd\ntrain = pd.read_csv("
    batch = {"prompts": [[{"role": "user", "content": "p"}]] * 2, "completions": [good, unfinished]}
    first = rewards(**batch, context_id=["0", "0"], prefill=["", ""])
    assert first[0] == pytest.approx(domain.reference(TASKS[1]).verifier_score)  # the same script, run again
    assert first[1] == pytest.approx(-10)  # a syntax error runs nothing
    second = rewards(**batch, context_id=["0", "0"], prefill=["", ""])
    assert len(graded) == 2  # the model step ran nothing
    calibrated = ranker.score([f"{task.text}\n\n{good}"])[0]["calibrated"]
    assert second == [pytest.approx(calibrated), pytest.approx(-10)]
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [row["source"] for row in rows] == ["verifier", "verifier", "reward_model", "not run"]
    log = [json.loads(line) for line in (tmp_path / "reward_log.jsonl").read_text().splitlines()]
    assert log[1]["verifier_calls_saved"] == 2 and log[0]["valid_rate"] == 0.5
