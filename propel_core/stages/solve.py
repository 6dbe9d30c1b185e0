"""What the generated tasks are for: training a solver on them (``solve-train``) and verifier-filtered
self-training (``self-train``, the progress-aware sampling study, section 3.4) -> ``RUN/solve/NAME/``
and ``RUN/self_train/``.

``solve-train`` RL-trains the solver with LoRA (TRL's RLOO or GRPO; reward 1 when the domain's grader
says solved, or a reward rule of the verdict's markers and verifier score, with replay and RM-GRPO's
schedule: ``propel_core.training.solver_reward.SolverRewards``) on a task set, then evaluates the
untrained and the trained solver on held-out tasks: average score, unbiased pass@k, zero-success rate, and paired
per-prompt comparisons. Running it twice with different ``solve_train.tasks`` (say the trained
generator's in-band tasks, then the base generator's tasks) and ``solve_train.baseline`` set to the
first run's name is the downstream test of the claim that frontier tasks are better training data.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from propel_core.errors import NotEnoughData, PropelError
from propel_core.evaluation import paired_comparison, solver_metrics, split_held_out
from propel_core.execution import graded_attempts, solve_counts
from propel_core.probes.bundles import load_probe
from propel_core.ranks import is_main
from propel_core.records import Label, Task, iter_jsonl, to_json
from propel_core.run import Run
from propel_core.training.checkpoints import goes_on, prepare_folder
from propel_core.training.solver import fine_tune_solver, keep_clean, train_solver
from propel_core.training.solver_reward import verified_corpus

log = logging.getLogger("propel")


def task_file(run: Run, name: str) -> Path:
    path = Path(name) if Path(name).is_absolute() else run.dir / name
    if not path.exists():
        raise PropelError(f"{path} does not exist (set the path, or run the stage that writes it)")
    return path


def training_tasks(run: Run, path: Path, in_band_only: bool) -> list[Task]:
    tasks = [task for task in iter_jsonl(path, Task) if task.validity.valid]
    if in_band_only:
        labels = task_file(run, str(path.parent / "labels.jsonl"))
        in_band = {label.task_id for label in iter_jsonl(labels, Label) if label.utility == 1}
        tasks = [task for task in tasks if task.id in in_band]
    if not tasks:
        raise NotEnoughData(f"no {'in-band ' if in_band_only else ''}valid tasks in {path} to train a solver on")
    return tasks


def solve_train(run: Run) -> None:
    """RL-train the solver on a task set and evaluate it on held-out tasks -> solve/NAME/."""
    plan = run.plans.solve_train
    options, folder = plan.options, plan.folder
    domain = run.domain()
    exists = goes_on(folder, plan.resume)
    rule_keys = ("reward.r_bad", f"reward.options.{options.reward_rule}") if options.reward_rule else ()
    run.claim(f"solve/{options.name}", exists, rule_keys, {"reward.r_bad": plan.reward.r_bad} if rule_keys else None)
    checkpoint = prepare_folder(folder, plan.resume, run.say)  # after the claim: a refusal moves nothing
    tasks = training_tasks(run, task_file(run, options.tasks), options.in_band_only)
    held_out, tasks = split_held_out(task_file(run, options.held_out), tasks, options.held_out_tasks)
    log.info("solver training on %d tasks, evaluation on %d held-out tasks", len(tasks), len(held_out))

    if options.replay.strategy != "none" and domain.multi_turn:  # and algorithm grpo: its plan checked that
        raise PropelError("solve_train.replay works with a single-turn domain; set solve_train.replay.strategy: none")
    reward_model = load_probe(task_file(run, options.reward_model), run.registry) if options.model_steps else None
    train_solver(run.services, plan, tasks, reward_model, checkpoint)
    if not is_main():  # under accelerate launch the main process evaluates, alone
        return
    verified = verified_corpus(folder, tasks, plan.band)
    log.info("verified rollouts: %s (rank them with rank.items=attempts rank.labels=...)", verified)

    k = options.eval_k
    per_prompt = {
        arm: solve_counts(run.services, held_out, plan.solver.with_adapter(adapter), k, plan.seed)
        for arm, adapter in (("base", None), ("trained", folder / "adapter"))
    }
    metrics = {arm: solver_metrics(counts, k) for arm, counts in per_prompt.items()}
    rates = {arm: [count / k for count in counts] for arm, counts in per_prompt.items()}
    comparisons = {"trained_vs_base": paired_comparison(rates["trained"], rates["base"], seed=plan.seed)}
    if options.baseline:
        other = json.loads(task_file(run, f"solve/{options.baseline}/per_prompt.json").read_text())
        if other["held_out"] != [task.text for task in held_out]:
            raise PropelError(
                f"solve run {options.baseline!r} was evaluated on other held-out tasks; use the same "
                "solve_train.held_out and held_out_tasks"
            )
        baseline_rates = [count / other["k"] for count in other["counts"]["trained"]]
        comparisons[f"trained_vs_{options.baseline}"] = paired_comparison(
            rates["trained"], baseline_rates, seed=plan.seed
        )
    (folder / "per_prompt.json").write_text(
        to_json({"k": k, "held_out": [task.text for task in held_out], "counts": per_prompt})
    )
    (folder / "metrics.json").write_text(json.dumps({"arms": metrics, "comparisons": comparisons}, indent=2))
    for arm, values in metrics.items():
        run.say(f"{arm:8s} " + "  ".join(f"{key} {value:.3f}" for key, value in values.items()))
    for name, comparison in comparisons.items():
        low, high = comparison["ci95"]
        run.say(
            f"{name}: wins {comparison['wins']}, losses {comparison['losses']}, ties {comparison['ties']}, "
            f"mean difference {comparison['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}]"
        )


def self_train(run: Run) -> None:
    """Sample K solver attempts per task, keep the verified and clean ones, fine-tune on them (SFT)."""
    plan = run.plans.self_train
    options, folder = plan.options, plan.folder
    domain = run.domain()
    folder.mkdir(parents=True, exist_ok=True)
    tasks = training_tasks(run, task_file(run, options.tasks), in_band_only=False)
    funnel = {"sampled": 0, "verified correct": 0, "within self_train.max_chars": 0}  # then the domain's checks
    kept: list[tuple[Task, str]] = []
    found = graded_attempts(run.services, tasks, options.k, plan.solver, plan.seed, description="self-train sampling")
    attempts = {task.id: graded for task, graded in found}
    capped = 0
    for task in tasks:  # in task order, whatever order the attempts finished in
        survivors = keep_clean(domain, attempts[task.id], options.max_chars, funnel)
        kept += [(task, text) for text in sorted(survivors, key=len)[: options.per_task_cap]]
        capped += min(len(survivors), options.per_task_cap)
    funnel["after per-task cap"] = capped
    if not kept:
        (folder / "filter_report.json").write_text(json.dumps({"funnel": funnel}, indent=2))
        raise NotEnoughData(f"no attempt survived the filters: {funnel}")
    fine_tune_solver(run.services, plan, kept, funnel)
