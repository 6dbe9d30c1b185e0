"""rounds: the generator and the solver trained in turns, the probe following the solver -> ``RUN/rounds/``.

The paper's next step (section 8): the solver is itself being trained, so the band moves. Round ``r``
(``RUN/rounds/rR/``, seeded by :func:`propel_core.plans.round_seed`):

1. ``train/``: GRPO on the generator against the round's probe (round 1: the run's selected one;
   then the probe round ``r-1`` refitted), from round ``r-1``'s generator adapter;
2. ``tasks.jsonl``: ``rounds.tasks`` tasks from the trained generator;
3. ``labels.jsonl``: ``rounds.label_budget`` of its valid tasks (a seeded sample; half of them when
   they are fewer than ``label_budget + min_solver_tasks``) labeled with the
   solver this round trains, after its training; ``labels_previous.jsonl``: the same tasks labeled
   with the solver the round started from (``rounds.audit_previous``). Together: the real in-band
   rate of the round's generator for the solver it was trained for and for the one it now faces;
4. ``solve/``: RL on the solver (solve-train's settings) from round ``r-1``'s solver adapter, on the
   other valid tasks that the round's probe scores in band (``solver_tasks.json``), never a held-out
   task or one of the labeled sample;
5. ``held_out.json``: the trained solver's score on the held-out tasks (``rounds/r0/``: the base
   solver's), with a 95% interval and paired comparisons with the base and the round before;
6. ``probe/``: the probe refitted at the selected cell on every label so far, the corpus and each
   round's, a label of ``a`` rounds ago kept with chance ``rounds.old_weight ** a``;
7. ``round.json``: the round's summary, the solver attempts it spent included; ``times.json`` its
   steps' seconds.

A round is finished when ``round.json`` exists; ``done.json`` lists its finished steps, so a rerun
(after a crash, Ctrl-C or kill -9) goes on at the first unfinished one, a training from its last
checkpoint. Finished files are never rewritten. Raising ``rounds.num_rounds`` adds rounds to a finished
run; any setting a round depends on changed is refused (``settings.json``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from pathlib import Path

from propel_core.errors import NotEnoughData, PropelError
from propel_core.evaluation import held_out_tasks, paired_comparison, rounds_curve, solver_metrics
from propel_core.execution import label_tasks, sample_tasks, solve_counts
from propel_core.plans import RoundPlan, round_plan
from propel_core.probes.activations import labeled_rows
from propel_core.probes.bundles import load_probe, read_bundle
from propel_core.probes.cells import fit_at_cell
from propel_core.probes.metrics import auc
from propel_core.records import Label, Task, iter_jsonl, replace_whole
from propel_core.run import Run
from propel_core.training.checkpoints import last_checkpoint, prepare_folder
from propel_core.training.generator import train_generator
from propel_core.training.solver import train_solver

log = logging.getLogger("propel")


def rounds(run: Run) -> None:
    """Train generator and solver in turns, refreshing the probe from the trained solver's labels."""
    config = run.config
    selected = run.input("probes/selected", made_by="probe")
    folder = run.dir / "rounds"
    first = run.plans.rounds
    run.claim("rounds", folder.exists(), (f"reward.options.{config.reward.rule}",))
    held_out = held_out_of(run.dir, first.options)
    base = folder / "r0" / "held_out.json"
    if not base.exists():
        run.say(f"rounds: the base solver on {len(held_out)} held-out tasks")
        counts = solve_counts(run.services, held_out, config.solver, config.solve_train.eval_k, first.held_out_seed)
        write_json(base, held_out_summary(counts, config.solve_train.eval_k, None, None, first.held_out_seed))
    probe, generator, solver = selected, None, None
    for number in range(1, first.options.num_rounds + 1):
        plan = round_plan(config, number, probe, generator, solver)
        if not (plan.folder / "round.json").exists():
            play_round(run, plan, probe, held_out, selected)
        if plan.options.refresh_probe:
            probe = plan.folder / "probe"
        if trains_generator(plan):
            generator = plan.train.folder / "adapter"
        solver = plan.solve.folder / "adapter"
    run.say(curve(folder))


def held_out_of(run_dir: Path, options) -> list[Task]:
    """The solver's held-out tasks: the first ``held_out_tasks`` valid ones of ``rounds.held_out``."""
    path = Path(options.held_out) if Path(options.held_out).is_absolute() else run_dir / options.held_out
    if not path.exists():
        raise PropelError(f"{path} does not exist: set rounds.held_out, or run `propel generate`")
    return held_out_tasks(path, options.held_out_tasks)


def play_round(run: Run, plan: RoundPlan, probe: Path, held_out: list[Task], selected: Path) -> None:
    """Round ``plan.number``'s steps, each one skipped when ``done.json`` lists it."""
    services, folder, options = run.services, plan.folder, plan.options
    folder.mkdir(parents=True, exist_ok=True)
    step = Steps(folder, lambda what: run.say(f"round {plan.number}/{options.num_rounds}: {what}"))

    writer = plan.train.generator
    if trains_generator(plan):
        writer = writer.with_adapter(plan.train.folder / "adapter")

        @step("train", f"training the generator against {shown(run.dir, probe)}")
        def _():
            prepare_folder(plan.train.folder, last_checkpoint(plan.train.folder) is not None, run.say)
            train_generator(services, plan.train)

    @step("tasks", f"{options.tasks} tasks from {writer.shown}")
    def _():
        contexts = plan.tasks.sampler(services).sample(options.tasks)
        sample_tasks(services, writer, contexts, folder / "tasks.jsonl", plan.seed)

    tasks = [task for task in iter_jsonl(folder / "tasks.jsonl", Task) if task.validity.valid]
    texts = {same_text(task) for task in held_out}
    fresh = [task for task in tasks if same_text(task) not in texts]
    labeled = options.label_budget
    if len(fresh) < options.label_budget + options.min_solver_tasks:  # too few for both: half of them each
        labeled = min(options.label_budget, len(fresh) // 2)
    sample = random.Random(plan.seed).sample(fresh, labeled)
    sampled = {task.id for task in sample}

    @step("select", "scoring its tasks with the probe")
    def _():
        candidates = [task for task in fresh if task.id not in sampled]
        write_json(folder / "solver_tasks.json", solver_tasks(run, plan, probe, candidates, len(tasks), len(sample)))

    chosen = set(read_json(folder / "solver_tasks.json", {"ids": []})["ids"])

    @step("labels_previous", "labeling a sample with the solver it starts from")
    def _():
        if plan.previous is not None:
            label_tasks(services, sample, folder / "labels_previous.jsonl", plan.previous)

    @step("solve", f"training the solver on {len(chosen)} tasks")
    def _():
        checkpoint = prepare_folder(plan.solve.folder, last_checkpoint(plan.solve.folder) is not None, run.say)
        train_solver(services, plan.solve, [task for task in tasks if task.id in chosen], None, checkpoint)

    @step("labels", "labeling the sample with the trained solver")
    def _():
        label_tasks(services, sample, folder / "labels.jsonl", plan.labels)

    @step("held_out", f"the trained solver on {len(held_out)} held-out tasks")
    def _():
        k = plan.solve.options.eval_k
        counts = solve_counts(services, held_out, plan.labels.solver, k, plan.held_out_seed)
        before = read_json(folder.parent / f"r{plan.number - 1}" / "held_out.json", {})["counts"]
        base = read_json(folder.parent / "r0" / "held_out.json", {})["counts"]
        write_json(folder / "held_out.json", held_out_summary(counts, k, base, before, plan.seed))

    if options.refresh_probe:

        @step("probe", "refitting the probe on every label so far")
        def _():
            refit_probe(run, plan, probe, selected)

    write_json(folder / "round.json", summary(run, plan, probe, tasks))


def solver_tasks(run: Run, plan: RoundPlan, probe: Path, candidates: list[Task], valid: int, labeled: int) -> dict:
    """The tasks the round's solver trains on (``solver_tasks.json``): the ``candidates`` whose
    probability under ``probe`` reaches ``rounds.in_band_probability``, or the ``min_solver_tasks``
    best scored when fewer do."""
    options = plan.options
    if not candidates:
        raise NotEnoughData(
            f"round {plan.number}: no valid task of the trained generator is left to train the solver on "
            f"({valid} valid, {labeled} labeled, the others held out); raise rounds.tasks"
        )
    scores = load_probe(probe, run.registry).score([task.text for task in candidates])
    ranked = sorted(zip(candidates, scores, strict=True), key=lambda pair: -pair[1]["probability"])
    chosen = [(task, s) for task, s in ranked if s["probability"] >= options.in_band_probability]
    fallback = len(chosen) < options.min_solver_tasks
    if fallback:
        chosen = ranked[: options.min_solver_tasks]
        run.say(
            f"round {plan.number}: {sum(s['probability'] >= options.in_band_probability for _, s in ranked)} "
            f"tasks reach probability {options.in_band_probability}; the solver trains on the {len(chosen)} "
            "best scored"
        )
    return {
        "ids": [task.id for task, _ in chosen],
        "probabilities": [round(s["probability"], 6) for _, s in chosen],
        "scored": len(ranked),
        "in_band": sum(s["probability"] >= options.in_band_probability for _, s in ranked),
        "fallback": fallback,
    }


class Steps:
    """A round's steps, each run once: ``done.json`` lists the finished ones (a rerun skips them),
    ``times.json`` their seconds. ``@steps(name, what)`` over a function runs it now, unless done."""

    def __init__(self, folder: Path, say) -> None:
        self.folder, self.say = folder, say
        self.done, self.times = read_json(folder / "done.json", []), read_json(folder / "times.json", {})

    def __call__(self, name: str, what: str):
        def run_step(work) -> None:
            if name in self.done:
                return
            self.say(what)
            started = time.monotonic()
            work()
            self.times[name] = round(time.monotonic() - started, 1)
            self.done.append(name)
            write_json(self.folder / "times.json", self.times)
            write_json(self.folder / "done.json", self.done)

        return run_step


def same_text(task: Task) -> str:
    """A task's text as held-out tasks are told apart from a round's: spacing and case aside."""
    return " ".join(json.dumps(task.text).lower().split())


def trains_generator(plan: RoundPlan) -> bool:
    """Whether round ``plan.number`` trains the generator (``rounds.generator``)."""
    return plan.options.generator == "every_round" or (plan.options.generator == "first_round" and plan.number == 1)


def refit_probe(run: Run, plan: RoundPlan, probe: Path, selected: Path) -> None:
    """The round's probe (``probe/``) at the selected cell, fitted on the corpus's labels and every
    round's so far, a label ``a`` rounds old kept with chance ``old_weight ** a`` (seeded)."""
    import torch

    bundle = read_bundle(selected)
    scorer = load_probe(probe, run.registry)
    chance = random.Random(plan.seed)
    x, y = labeled_rows(run.dir, bundle.layer, bundle.pooling)
    keep = [chance.random() < plan.options.old_weight**plan.number for _ in range(len(y))]
    xs, ys = [x[torch.tensor(keep, dtype=torch.bool)]], [y[torch.tensor(keep, dtype=torch.bool)]]
    for number in range(1, plan.number + 1):
        folder = plan.folder.parent / f"r{number}"
        labels = [label for label in iter_jsonl(folder / "labels.jsonl", Label) if label.utility is not None]
        labels = [label for label in labels if chance.random() < plan.options.old_weight ** (plan.number - number)]
        if not labels:
            continue
        text = {task.id: task.text for task in iter_jsonl(folder / "tasks.jsonl", Task)}
        xs.append(scorer.features([text[label.task_id] for label in labels]))
        ys.append(torch.tensor([float(label.utility) for label in labels]))
    x, y = torch.cat(xs), torch.cat(ys)
    if y.sum() == 0 or y.sum() == len(y):
        raise NotEnoughData(
            f"round {plan.number}: the probe's refit has {len(y)} labels of one class; raise rounds.label_budget "
            "or rounds.old_weight"
        )
    fit_at_cell(run.registry, plan.folder / "probe", bundle, x, y, plan.probe, plan.seed, f"round {plan.number}")


def held_out_summary(counts: list[int], k: int, base: list[int] | None, before: list[int] | None, seed: int) -> dict:
    """A solver's held-out solve counts, its metrics, the average score's 95% interval (normal, over
    tasks), and paired comparisons with the base solver's counts and the round before's."""
    rates = [count / k for count in counts]
    mean = sum(rates) / len(rates)
    spread = math.sqrt(sum((rate - mean) ** 2 for rate in rates) / max(len(rates) - 1, 1) / len(rates))
    found = {"k": k, "counts": counts, "metrics": solver_metrics(counts, k)}
    found["ci95"] = [max(0.0, mean - 1.96 * spread), min(1.0, mean + 1.96 * spread)]
    for name, other in (("vs_base", base), ("vs_previous", before)):
        if other is not None:
            found[name] = paired_comparison(rates, [count / k for count in other], seed=seed)
    return found


def in_band(path: Path) -> dict | None:
    """The share of a labels file's known labels that are in band, with its count."""
    if not path.exists():
        return None
    known = [label.utility for label in iter_jsonl(path, Label) if label.utility is not None]
    return {"labels": len(known), "in_band": sum(known) / len(known) if known else None}


def summary(run: Run, plan: RoundPlan, probe: Path, tasks: list[Task]) -> dict:
    """``round.json``: what the round made and what it spent."""
    import torch

    folder, solve = plan.folder, plan.solve.options
    labels = {label.task_id: label for label in iter_jsonl(folder / "labels.jsonl", Label)}
    known = [(task, labels[task.id]) for task in tasks if task.id in labels and labels[task.id].utility is not None]
    stale = None
    if known:
        scores = load_probe(probe, run.registry).score([task.text for task, _ in known])
        y = torch.tensor([float(label.utility) for _, label in known])
        stale = auc(y, torch.tensor([s["logit"] for s in scores]))
    k = plan.labels.label.k
    attempts = {
        "labels": k * len(labels),
        "labels_previous": k * sum(1 for _ in iter_jsonl(folder / "labels_previous.jsonl", Label)),
        "solver_training": verifier_calls(plan.solve.folder / "reward_log.jsonl"),
        "held_out": solve.eval_k * len(read_json(folder / "held_out.json", {"counts": []})["counts"]),
    }
    log_path = plan.train.folder / "reward_log.jsonl"
    rewards = [json.loads(line) for line in log_path.read_text().splitlines()] if trains_generator(plan) else []
    return {
        "round": plan.number,
        "probe": shown(run.dir, probe),
        "tasks": {
            "generated": sum(1 for _ in iter_jsonl(folder / "tasks.jsonl", Task)),
            "valid": len(tasks),
            **read_json(folder / "solver_tasks.json", {}),
        },
        "generator_reward": rewards[-1].get("reward_mean") if rewards else None,
        "in_band": {
            "trained_solver": in_band(folder / "labels.jsonl"),
            "previous_solver": in_band(folder / "labels_previous.jsonl"),
        },
        "probe_auc_on_round_labels": None if stale is None or math.isnan(stale) else stale,
        "held_out": {key: value for key, value in read_json(folder / "held_out.json", {}).items() if key != "counts"},
        "solver_attempts": attempts | {"total": sum(attempts.values())},
    }


def verifier_calls(path: Path) -> int:
    """The solver attempts a solve-train's rewards graded: its reward log's last count, the further
    draws of ``zero_variance: refill`` included."""
    lines = path.read_text().splitlines() if path.exists() else []
    return json.loads(lines[-1]).get("verifier_calls", 0) if lines else 0


def curve(folder: Path) -> str:
    """The rounds' held-out score and in-band rates, a line each (:func:`rounds_curve`)."""
    lines = []
    for row in rounds_curve(folder):
        low, high = row["ci95"]
        line = f"r{row['round']}  held-out score {row['score']:.3f} [{low:.3f}, {high:.3f}]"
        if row["round"]:
            line += (
                f"  in band for the trained solver {rate(row['in_band_trained'])}, for the solver before "
                f"{rate(row['in_band_previous'])}  solver attempts so far {row['attempts']}"
            )
        lines.append(line)
    return "\n".join(lines)


def rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def shown(run_dir: Path, path: Path) -> str:
    return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)


def read_json(path: Path, default):
    return json.loads(path.read_text()) if path.exists() else default


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())
