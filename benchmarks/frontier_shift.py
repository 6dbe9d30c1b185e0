"""Does probe-reward RL shift the generator toward the target band, and at what solver cost?

A miniature of the paper's Figure 2 and its solver-in-the-loop comparison (Table 3), run with one
command:

    .venv/bin/python benchmarks/frontier_shift.py benchmarks/frontier_shift.yaml [key=value ...] [--seeds 3]
        [--arms hard,wco,sil]

1. The corpus, once: the run's generate, label, extract and probe stages, then a second probe at the
   selected cell with another seed for the wco ensemble (the coevolve stage's ensemble).
2. For each RL seed, from the same base generator with the same steps and rollouts: GRPO with the
   ``hard`` rule (probe logit; audited by the real solver when ``train.audit.every`` is set), the
   ``wco`` rule (minimum over the two probes) and ``solver_in_the_loop`` (sil: live solver utility,
   no probe).
3. Then, for that RL seed, every arm and the untrained base write ``evaluate.num_tasks`` tasks from
   the same fresh contexts with the same generation seeds; the solver attempts each valid one
   ``evaluate.k`` times (the probe judges nothing here; it is only scored for the diagnostics). Seed
   by seed, so an experiment stopped early has whole seeds.
4. ``RUN/experiment/frontier_shift.json`` (``experiment.summarize``, beside this script), its figures, and
   ``RUN/report.html``, which opens with the answer.

Every piece records its wall time in ``RUN/experiment/timings.json`` when it finishes; a rerun skips
finished pieces and resumes unfinished ones (an interrupted piece's seconds are added to its rerun's),
so an interrupted experiment loses little. A rerun with another config is refused, naming the keys
that differ. More seeds (``--seeds 5`` after 3) add pieces and reuse the finished ones, and so do more
arms (``--arms hard`` first, then all three).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path

from experiment import ARMS, FILE, TRAINED, Timings, figures, summarize

from propel_core.errors import PropelError
from propel_core.execution import sample_and_label
from propel_core.plans import EvaluationPlan, evaluation_plan, generator_plan
from propel_core.probes.bundles import load_probe
from propel_core.probes.cells import ensemble_probes
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run, start_run
from propel_core.stages import STAGES, report
from propel_core.training.audit import audit_of
from propel_core.training.generator import train_generator

log = logging.getLogger("propel")


def train_arm(run: Run, seed: int, rule: str, probes: list[Path], folder: Path) -> None:
    """Train one arm: the experiment's config with the arm's reward rule (and ensemble members) and
    RL seed; the solver-in-the-loop arm's live labels are seeded by the RL seed too. The ``hard`` arm
    is audited when ``train.audit.every`` is set (the train stage's audit: K = ``train.audit.k`` or
    ``label.k``)."""
    plan = replace(generator_plan(run.config, folder, seed, rule).with_probes(probes), resume=False)
    audit = audit_of(run.services, folder, plan.audit) if rule == "hard" and plan.audit is not None else None
    train_generator(run.services, plan, audit)


def evaluate_arm(run: Run, contexts, adapter: Path | None, folder: Path, plan: EvaluationPlan, probe) -> None:
    """Sample and solve one arm's tasks into ``folder`` as the evaluate stage does (``plan``: K =
    ``evaluate.k``, the evaluation seed of an RL seed); keep the probe's logit of each labeled task
    (``probe_logits.json``) for the diagnostics, never for the verdict."""
    tasks, labels = sample_and_label(run.services, plan, adapter, contexts, folder)
    labels = [label for label in labels if label.utility is not None]
    text = {task.id: task.text for task in tasks}
    scores = probe.score([text[label.task_id] for label in labels]) if labels else []
    logits = {label.task_id: score["logit"] for label, score in zip(labels, scores, strict=True)}
    (folder / "probe_logits.json").write_text(json.dumps(logits))


def setting(run: Run, seeds: list[int]) -> dict:
    """What the numbers were measured on, recorded beside them."""
    config = run.config
    labels = list(iter_jsonl(run.dir / "labels.jsonl", Label))
    tasks = list(iter_jsonl(run.dir / "tasks.jsonl", Task))
    train = config.train
    return {
        "domain": config.domain.name,
        "generator": config.generator.model_id,
        "solver": run.registry.backend(config.solver).model_id,  # the backend's own name for itself
        "band": [config.label.band_low, config.label.band_high],
        "k": config.label.k,
        "corpus": {
            "generations": len(tasks),
            "labeled": len(labels),
            "in_band": sum(label.utility == 1 for label in labels),
        },
        "seeds": seeds,
        "steps": train.steps,
        "group_size": train.group_size,
        "rollouts_per_step": train.per_device_batch * train.gradient_accumulation,
        "lr": train.lr,
        "beta": train.beta,
        "lora": [config.lora.r, config.lora.alpha],
        "temperature": train.temperature,
        "max_completion_length": train.max_completion_length,
        # null: calibrated from the probe for an arm paid in logits (each arm's summary has what it paid)
        "r_bad": config.reward.r_bad,
        "overflow_reward": config.reward.overflow_reward,
        "eval_tasks_per_seed": config.evaluate.num_tasks,
        "eval_k": config.evaluate.k,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a propel config (benchmarks/frontier_shift.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--seeds", type=int, default=3, help="RL seeds (0..N-1), each trains every arm of --arms")
    parser.add_argument(
        "--arms",
        default=",".join(TRAINED),
        help=f"the trained arms to run, comma-separated (default and choices: {','.join(TRAINED)}); base always runs",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = parser.parse_intermixed_args(argv)
    trained = list(dict.fromkeys(arm.strip() for arm in args.arms.split(",") if arm.strip()))
    if not trained or set(trained) - set(TRAINED):
        parser.error(f"--arms {args.arms!r}: choose one or more of {', '.join(TRAINED)}, comma-separated")
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    run = start_run([args.config], args.overrides, args.quiet)
    root = run.dir / "experiment"
    seeds = list(range(args.seeds))
    timings = Timings(root / "timings.json", run.config.model_dump(mode="json"))

    for name in ("generate", "label", "extract", "probe"):
        timings.run(("corpus", name), lambda name=name: STAGES[name](run))
    members = root / "ensemble"
    if "wco" in trained:  # the other members of the ensemble wco takes the minimum over
        size = run.config.coevolve.ensemble_size
        work = lambda: ensemble_probes(run.registry, run.dir, run.config.probe, run.config.seed, size, members)  # noqa: E731
        timings.run(("corpus", "ensemble"), work)
    extra = sorted(members.glob("seed-*"))

    probe = load_probe(run.dir / "probes" / "selected", run.registry)
    for seed in seeds:  # seed by seed, so a run stopped early has whole seeds to show
        for arm in trained:
            folder = root / arm / f"seed-{seed}"
            log.info("== train %s, RL seed %d -> %s", arm, seed, folder)
            probes = extra if arm == "wco" else []
            work = lambda s=seed, r=ARMS[arm], p=probes, f=folder: train_arm(run, s, r, p, f)  # noqa: E731
            timings.run(("train", arm, str(seed)), work)
        evaluation = evaluation_plan(run.config, seed)
        contexts = evaluation.contexts.sampler(run.services).sample(evaluation.num_tasks)
        for arm in ("base", *trained):
            adapter = None if arm == "base" else root / arm / f"seed-{seed}" / "adapter"
            folder = root / "eval" / f"seed-{seed}" / arm
            log.info("== evaluate %s, RL seed %d -> %s", arm, seed, folder)
            work = lambda c=contexts, a=adapter, f=folder, e=evaluation: evaluate_arm(run, c, a, f, e, probe)  # noqa: E731
            timings.run(("eval", arm, str(seed)), work)

    summary = summarize(root, seeds, run.config.evaluate.k, setting(run, seeds), timings.data, trained)
    (root / FILE).write_text(json.dumps(summary, indent=2))
    figures(summary, root, run.config.label)
    report(run)
    print(summary["verdict"])
    for arm, values in summary["arms"].items():
        utility = values["utility"]
        print(
            f"{arm:>5}: utility {utility['mean']:.3f} ± {utility['se']:.3f} (SE over {len(seeds)} seeds), "
            f"solver trials {values['solver_trials']['total']:.0f}, wall {values['wall_seconds']['total']:.0f} s"
        )


if __name__ == "__main__":
    try:
        main()
    except PropelError as error:  # a bad config or a changed one: one line, finished pieces kept
        sys.exit(f"error: {error}")
