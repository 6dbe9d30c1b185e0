"""What the audit (``train.audit``) costs a training step: GRPO on the demo's settings with no audit vs an
audit of 16 tasks x K = 4 every 5 steps, labeled by the demo's solver (the embedded model) on the
local executor while training goes on.

Both arms train the embedded generator on the arithmetic domain (the demo's train and solver
settings) against the same probe bundle (countdown tasks with a planted label, as the tests use:
the demo's own probe needs its whole corpus labeled first, a quarter of an hour here), for the same
steps from the same seed. Two times per training: TRL's ``train_runtime`` (the whole training, which
an audit slows while it runs beside a step) and the median of TRL's ``step_time`` over its steps
after the first (a typical step, which an audit every 5 steps mostly leaves alone). The arms
alternate, each round in a rotated order, after a warm-up round (timing.compare); the ratios are
from one run.

    python benchmarks/audit.py [--steps 10] [--repeats 2]
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from timing import compare

from propel_core.plans import load_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_core.stages.extract import extract
from propel_core.stages.probe import probe
from propel_core.stages.train import train
from propel_core.testing import planted_countdown_run

DEMO = Path(__file__).resolve().parent.parent / "propel_core" / "configs" / "demo.yaml"
AUDIT = ["train.audit.every=5", "train.audit.tasks=16", "train.audit.k=4"]


def probe_bundle(root: Path, registry: Registry) -> Path:
    folder = planted_countdown_run(root / "probe")
    overrides = [f"run_dir={folder}", "domain.name=countdown", "probe.layers=[8]", "probe.poolings=[mean_full]"]
    overrides += ["probe.architectures=[linear]", "probe.split=random"]
    run = Run(load_config(DEMO, overrides, registry), registry)
    extract(run)
    probe(run)
    return folder / "probes" / "selected"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    registry = Registry.build()
    root = Path(tempfile.mkdtemp())
    bundle = probe_bundle(root, registry)
    step_medians: dict[str, list[float]] = {"no audit": [], "audit": []}
    runtimes: dict[str, list[float]] = {"no audit": [], "audit": []}  # TRL's train_runtime, whole training
    audits: list[dict] = []
    count = iter(range(1000))

    def arm(name: str, extra: list[str]):
        def go():
            folder = root / f"{name.replace(' ', '-')}-{next(count)}"
            overrides = [f"run_dir={folder}", f"train.steps={args.steps}", f"reward.main_probe={bundle}", *extra]
            run = Run(load_config(DEMO, overrides, registry), registry, quiet=True)
            train(run)
            steps = [json.loads(line) for line in (folder / "train" / "log.jsonl").read_text().splitlines()]
            times = [s["step_time"] for s in steps if "step_time" in s][1:]
            step_medians[name].append(statistics.median(times))
            runtimes[name].extend(s["train_runtime"] for s in steps if "train_runtime" in s)
            if name == "audit":
                audits.extend(json.loads(line) for line in (folder / "train" / "audit.jsonl").read_text().splitlines())

        return go

    compare({"no audit": arm("no audit", ["train.audit.every=0"]), "audit": arm("audit", AUDIT)}, repeats=args.repeats)
    print(f"GRPO step on the demo's settings, {args.steps} steps a training, step_time median over steps 2..")
    for name, medians in step_medians.items():
        timed = medians[1:]  # the first of each arm was the warm-up round
        print(f"  {name:9s} min {min(timed):6.2f} s  median {statistics.median(timed):6.2f} s  ({timed})")
    base, audited = (statistics.median(step_medians[n][1:]) for n in ("no audit", "audit"))
    print(f"  audit / no audit: {audited / base:.3f}x the median step time")
    for name, seconds in runtimes.items():
        print(f"  {name:9s} whole training (TRL train_runtime): {seconds[1:]} s")
    base, audited = (statistics.median(runtimes[n][1:]) for n in ("no audit", "audit"))
    low = min(runtimes["audit"][1:]) / min(runtimes["no audit"][1:])
    print(f"  audit / no audit: {low:.3f}x (min), {audited / base:.3f}x (median) the training time; target <= 1.10")
    trials = sum(a["trials"] for a in audits)
    seconds = statistics.median(a["seconds"] for a in audits)
    print(f"  {len(audits)} audits, {trials} solver trials, {seconds:.1f} s each (median), beside training")


if __name__ == "__main__":
    main()
