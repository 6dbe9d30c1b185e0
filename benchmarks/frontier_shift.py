"""Does probe-reward RL shift the generator toward the target band, and at what solver cost?

A miniature of the paper's Figure 2 and its solver-in-the-loop comparison (Table 3), run with one
command:

    .venv/bin/python benchmarks/frontier_shift.py benchmarks/frontier_shift.yaml [key=value ...] [--seeds 3]

1. The corpus, once: the run's generate, label, extract and probe stages, then a second probe at the
   selected cell with another seed for the wco ensemble (the coevolve stage's ensemble).
2. For each RL seed, from the same base generator with the same steps and rollouts: GRPO with the
   ``hard`` rule (probe logit), the ``wco`` rule (minimum over the two probes) and
   ``solver_in_the_loop`` (sil: live solver utility, no probe).
3. For each RL seed, every arm and the untrained base write ``evaluate.num_tasks`` tasks from the
   same fresh contexts with the same generation seeds; the solver attempts each valid one
   ``evaluate.k`` times (the probe judges nothing here; it is only scored for the diagnostics).
4. ``RUN/experiment/frontier_shift.json`` (propel_core.experiment.summarize), its figures, and
   ``RUN/report.html``, which opens with the answer.

Every piece records its wall time in ``RUN/experiment/timings.json`` when it finishes; a rerun skips
finished pieces and resumes unfinished ones (an interrupted piece's seconds are added to its rerun's),
so an interrupted experiment loses little. A rerun with another config is refused, naming the keys
that differ. More seeds (``--seeds 5`` after 3) add pieces and reuse the finished ones.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from propel_core.config import load_config
from propel_core.errors import PropelError
from propel_core.execution import draw_contexts, label_tasks, sample_tasks
from propel_core.experiment import ARMS, FILE, Timings, figures, summarize
from propel_core.plugins import Registry
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run
from propel_core.stages import STAGES, report
from propel_core.stages.coevolve import ensemble
from propel_core.stages.evaluate import evaluation_config
from propel_core.stages.train import train_generator

log = logging.getLogger("propel")


def arm_run(run: Run, seed: int, rule: str, probes: list[Path]) -> Run:
    """The run a trained arm trains in: the experiment's config with the arm's rule and RL seed."""
    config = run.config
    reward = config.reward.model_copy(update={"rule": rule, "probes": [str(p) for p in probes]})
    return Run(config.model_copy(update={"seed": seed, "reward": reward}), run.registry, quiet=run.quiet,
               _domain=run.domain(), _executor=run._executor)  # fmt: skip


def evaluation_run(run: Run, seed: int) -> Run:
    """The run an RL seed's arms are evaluated in: the evaluate stage's settings (fresh contexts and
    generation seeds, ``evaluate.num_tasks`` of them, ``evaluate.k`` attempts), shifted by the seed."""
    return Run(evaluation_config(run.config, seed), run.registry, quiet=run.quiet, _domain=run.domain(),
               _executor=run._executor)  # fmt: skip


def evaluate_arm(run: Run, contexts, adapter: Path | None, folder: Path, probe) -> None:
    """Sample and solve one arm's tasks into ``folder``; keep the probe's logit of each labeled task
    (``probe_logits.json``) for the diagnostics, never for the verdict."""
    model = run.config.generator.model_copy(update={"adapter": str(adapter) if adapter else None})
    tasks = sample_tasks(run, model, contexts, folder / "tasks.jsonl")
    valid = [task for task in tasks if task.validity.valid]
    labels = [label for label in label_tasks(run, valid, folder / "labels.jsonl") if label.utility is not None]
    text = {task.id: task.text for task in valid}
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
        "lora": [train.lora_r, train.lora_alpha],
        "temperature": train.temperature,
        "max_completion_length": train.max_completion_length,
        "r_bad": config.reward.r_bad,
        "overflow_reward": config.reward.overflow_reward,
        "eval_tasks_per_seed": config.evaluate.num_tasks,
        "eval_k": config.evaluate.k,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a propel config (benchmarks/frontier_shift.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--seeds", type=int, default=3, help="RL seeds (0..N-1), each trains every arm")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = parser.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    registry = Registry.build()
    run = Run(load_config([args.config], args.overrides, registry), registry, quiet=args.quiet)
    run.save_config()
    root = run.dir / "experiment"
    seeds = list(range(args.seeds))
    timings = Timings(root / "timings.json", run.config.model_dump(mode="json"))

    for name in ("generate", "label", "extract", "probe"):
        timings.run(("corpus", name), lambda name=name: STAGES[name](run))
    members = root / "ensemble"
    timings.run(("corpus", "ensemble"), lambda: ensemble(run, members))
    extra = sorted(members.glob("seed-*"))

    for seed in seeds:
        for arm, rule in ARMS.items():
            if rule is not None:
                trained = arm_run(run, seed, rule, extra if arm == "wco" else [])
                folder = root / arm / f"seed-{seed}"
                log.info("== train %s, RL seed %d -> %s", arm, seed, folder)
                timings.run(("train", arm, str(seed)), lambda r=trained, f=folder: train_generator(r, f))

    from propel_core.probes import load_probe

    probe = load_probe(run.dir / "probes" / "selected", registry)
    for seed in seeds:
        evaluation = evaluation_run(run, seed)
        contexts = draw_contexts(evaluation)
        for arm, rule in ARMS.items():
            adapter = None if rule is None else root / arm / f"seed-{seed}" / "adapter"
            folder = root / "eval" / f"seed-{seed}" / arm
            log.info("== evaluate %s, RL seed %d -> %s", arm, seed, folder)
            work = lambda e=evaluation, c=contexts, a=adapter, f=folder: evaluate_arm(e, c, a, f, probe)  # noqa: E731
            timings.run(("eval", arm, str(seed)), work)

    summary = summarize(root, seeds, run.config.evaluate.k, setting(run, seeds), timings.data)
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
