"""Does the audit (``train.audit``) tell the truth about a training, and does its alarm fire when the
probe lies? Two trainings of the frontier-shift experiment's ``hard`` arm (benchmarks/frontier_shift.yaml:
the embedded generator, the simulated ``arithmetic_skill`` solver), each audited every 3 steps (16
tasks x K = 8) with the stop rule ``stop_gap: 0.3`` in 2 audits in a row:

1. with the experiment's selected probe: its audited utility, step by step, against the final
   evaluation of the trained adapter (``evaluate.num_tasks`` tasks, K = 8, the evaluation seed of
   RL seed 0): the last audits should fall within the evaluation's 95% interval;
2. with the same probe made overconfident (temperature 0.1: every probability pushed toward 0 or 1),
   a deliberately mis-calibrated probe: the alarm should fire and stop the training.

The corpus (generate, label, extract, probe) is the experiment's own, made once in ``run_dir``.

    python benchmarks/audit_evidence.py [run_dir=runs/audit_evidence]
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from frontier_shift import evaluate_arm

from propel_core.evaluation import arm_metrics
from propel_core.plans import evaluation_plan, generator_plan
from propel_core.probes.bundles import load_probe
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import start_run
from propel_core.stages import STAGES
from propel_core.training.audit import audit_of
from propel_core.training.generator import train_generator

CONFIG = Path(__file__).resolve().parent / "frontier_shift.yaml"
AUDIT = ["train.audit.every=3", "train.audit.tasks=16", "train.audit.k=8", "train.audit.stop_gap=0.3"]


def trained(run, folder: Path, main_probe: Path) -> list[dict]:
    """The hard arm, RL seed 0, audited; its audit records by step."""
    plan = generator_plan(run.config, folder, seed=0, rule="hard")
    reward = plan.reward.model_copy(update={"main_probe": str(main_probe)})
    plan = replace(plan, reward=reward, checkpoint_every=100, resume=False)
    audit = audit_of(run.services, folder, plan.audit)
    shutil.rmtree(folder, ignore_errors=True)
    train_generator(run.services, plan, audit)
    records = [json.loads(line) for line in (folder / "audit.jsonl").read_text().splitlines()]
    ending = f"stopped after step {audit.stopped_at}" if audit.stop_reason else "ran every step"
    print(f"{folder.name}: {ending}")
    if audit.stop_reason:
        print(f"  why: {audit.stop_reason}")
    for record in sorted(records, key=lambda r: r["step"]):
        gap = "   -  " if record["gap"] is None else f"{record['gap']:+.3f}"
        print(
            f"  step {record['step']:2d}: utility {record['utility']:.3f} ± {1.96 * record['utility_se']:.3f}, "
            f"probe p {record['probe_probability'] or 0:.3f}, gap {gap}, valid {record['valid_rate']:.2f}"
        )
    return records


def main() -> None:
    run = start_run([str(CONFIG)], ["run_dir=runs/audit_evidence", *AUDIT, *sys.argv[1:]], quiet=True)
    made = {"generate": "labels.jsonl", "label": "labels.jsonl", "extract": "activations", "probe": "probes/selected"}
    for name, output in made.items():  # the corpus once (generate and label resume where they stopped)
        if not (run.dir / output).exists():
            STAGES[name](run)
    selected = run.dir / "probes" / "selected"
    honest = trained(run, run.dir / "audited" / "honest", selected)

    evaluation = evaluation_plan(run.config)
    contexts = evaluation.contexts.sampler(run.services).sample(evaluation.num_tasks)
    folder = run.dir / "audited" / "honest-eval"
    probe = load_probe(selected, run.registry)
    evaluate_arm(run, contexts, run.dir / "audited" / "honest" / "adapter", folder, evaluation, probe)
    tasks, labels = list(iter_jsonl(folder / "tasks.jsonl", Task)), list(iter_jsonl(folder / "labels.jsonl", Label))
    metrics = arm_metrics(tasks, labels, 8)
    utility, se = metrics["utility"]
    low, high = utility - 1.96 * se, utility + 1.96 * se
    last = sorted(honest, key=lambda r: r["step"])[-2:]
    reach = [(r["utility"] - 1.96 * r["utility_se"], r["utility"] + 1.96 * r["utility_se"]) for r in last]
    inside = [a <= high and low <= b for a, b in reach]
    count = metrics["generations"]
    print(f"final evaluation: utility {utility:.3f}, 95% interval [{low:.3f}, {high:.3f}] ({count} tasks)")
    print(f"last two audits' intervals overlap it: {inside}")

    overconfident = run.dir / "probes" / "overconfident"
    shutil.rmtree(overconfident, ignore_errors=True)
    shutil.copytree(selected, overconfident)
    bundle = json.loads((overconfident / "probe.json").read_text())
    (overconfident / "probe.json").write_text(json.dumps(bundle | {"temperature": 0.1}, indent=2))
    trained(run, run.dir / "audited" / "overconfident", overconfident)


if __name__ == "__main__":
    main()
