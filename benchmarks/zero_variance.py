"""What dropping zero-variance groups (``zero_variance: drop``) does to GRPO, against keeping them.

Two settings, both on the embedded model and a finished demo run (``propel demo``; its folder is
``--demo``):

- ``train``: the generator's GRPO against the demo's probe (``reward.main_probe``), the demo's
  training settings with ``train.loss_type: dapo`` in both arms (drop needs a token-level loss), no
  audit;
- ``solve``: ``solve-train`` with ``algorithm: grpo`` (TRL's dapo loss) on the demo's in-band
  evaluation tasks of the trained arm, held out on the demo's corpus.

The peer is TRL's own behaviour (``keep``). For each seed the arms run one after the other
(keep, drop, keep, drop, ...), each in a fresh run folder, so both see the same machine state. Per
arm it prints the reward mean of each step (from ``reward_log.jsonl``), the share of groups of one
reward, the steps until the 3-step moving average of the reward first reaches ``--target`` (by
default halfway from the first step's mean to the best last-3-steps mean of all runs), seconds per
step, and for ``solve`` the trained solver's held-out average score.

    python benchmarks/zero_variance.py --demo runs/demo [--setting train solve] [--steps 12] [--seeds 0 1]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from propel_core.plans import load_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_core.stages.solve import solve_train
from propel_core.stages.train import train

ARMS = ("keep", "drop")


def overrides(setting: str, demo: Path, arm: str, seed: int, steps: int) -> list[str]:
    if setting == "train":
        return [
            f"reward.main_probe={demo / 'probes' / 'selected'}",
            f"train.steps={steps}",
            "train.audit.every=0",
            "train.loss_type=dapo",
            f"train.zero_variance={arm}",
            f"seed={seed}",
        ]
    return [
        f"solve_train.tasks={demo / 'eval' / 'trained' / 'tasks.jsonl'}",
        f"solve_train.held_out={demo / 'tasks.jsonl'}",
        "solve_train.held_out_tasks=16",
        "solve_train.eval_k=4",
        "solve_train.algorithm=grpo",
        f"solve_train.steps={steps}",
        "solve_train.group_size=4",
        "solve_train.per_device_batch=8",
        "solve_train.max_completion_length=16",
        "solve_train.lr=1e-4",
        f"solve_train.zero_variance={arm}",
        f"seed={seed}",
    ]


def one_run(setting: str, demo: Path, arm: str, seed: int, steps: int, folder: Path) -> dict:
    """One training; its reward log, wall time, and for ``solve`` the held-out metrics."""
    registry = Registry.build()
    config = load_config(
        str(demo / "config.yaml"), [f"run_dir={folder}", *overrides(setting, demo, arm, seed, steps)], registry
    )
    run = Run(config, registry, quiet=True)
    started = time.perf_counter()
    if setting == "train":
        train(run)
        logs = folder / "train"
    else:
        solve_train(run)
        logs = folder / "solve" / config.solve_train.name
    seconds = time.perf_counter() - started
    entries = [json.loads(line) for line in (logs / "reward_log.jsonl").read_text().splitlines()]
    metrics = json.loads((logs / "metrics.json").read_text()) if (logs / "metrics.json").exists() else {}
    return {"arm": arm, "seed": seed, "seconds": seconds, "entries": entries, "metrics": metrics}


def steps_to(entries: list[dict], target: float) -> int | None:
    means = [entry["reward_mean"] for entry in entries]
    for step in range(3, len(means) + 1):
        if statistics.fmean(means[step - 3 : step]) >= target:
            return step
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, required=True, help="a finished `propel demo` run folder")
    parser.add_argument("--setting", nargs="+", choices=("train", "solve"), default=["train", "solve"])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--target", type=float, default=None)
    args = parser.parse_args()
    for setting in args.setting:
        runs = []
        with tempfile.TemporaryDirectory() as scratch:
            for seed in args.seeds:
                for arm in ARMS:
                    folder = Path(scratch) / f"{setting}-{arm}-{seed}"
                    runs.append(one_run(setting, args.demo.resolve(), arm, seed, args.steps, folder))
        first = statistics.fmean(run["entries"][0]["reward_mean"] for run in runs)
        best = max(statistics.fmean(e["reward_mean"] for e in run["entries"][-3:]) for run in runs)
        target = args.target if args.target is not None else first + (best - first) / 2
        print(f"\n{setting}: {args.steps} steps, seeds {args.seeds}; target reward (3-step mean) {target:.3f}")
        print("arm   seed  steps-to-target  last-3 reward  groups of one reward  s/step  held-out average score")
        for run in runs:
            entries = run["entries"]
            flat = statistics.fmean(entry.get("degenerate_groups", 0.0) for entry in entries)
            last = statistics.fmean(entry["reward_mean"] for entry in entries[-3:])
            solved = run["metrics"].get("arms", {}).get("trained", {}).get("average_score")
            print(
                f"{run['arm']:5} {run['seed']:4}  {steps_to(entries, target) or '-':>15}  {last:13.3f}  "
                f"{flat:20.2f}  {run['seconds'] / len(entries):6.1f}  {solved if solved is not None else '-'}"
            )
            print("      reward per step: " + " ".join(f"{entry['reward_mean']:.2f}" for entry in entries))
        for arm in ARMS:
            mine = [run for run in runs if run["arm"] == arm]
            per_step = [run["seconds"] / len(run["entries"]) for run in mine]
            print(f"{arm}: s/step min {min(per_step):.1f} median {statistics.median(per_step):.1f}")
        keep, drop = (statistics.median(r["seconds"] for r in runs if r["arm"] == arm) for arm in ARMS)
        print(f"drop / keep wall time (median): {drop / keep:.2f}x")


if __name__ == "__main__":
    main()
