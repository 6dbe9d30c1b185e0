"""Torch's thread count while the local executor generates: torch's default (a thread per core) vs
the count the executor now chooses (the cores its workers leave free, plus one: ``chosen_threads``).

Generates ``--tasks`` arithmetic tasks with the embedded model through the local executor at its
default 8 workers (``execution.sample_tasks``, the generate stage's call; the demo's generator
sampling), a fresh run folder per call, the model loaded once beforehand. The ``before`` arm sets
``OMP_NUM_THREADS`` to torch's default count, so the executor keeps torch's own setting, as it did
before; both arms must write the same tasks (each generation is seeded by its task id).

The gap depends on the machine: on a quiet machine with a core per thread it is small; where other
processes compete for the cores (a shared CI runner, a container's CPU quota, tests running beside),
torch's threads wait for each other at every operation.

``--busy N`` runs N busy processes beside the benchmark for its whole length (each in a new session,
a neighbour as another job on a shared machine would be).

    python benchmarks/threads.py [--tasks 8] [--repeats 3] [--busy 0]
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from timing import compare, ratio, report

from propel_core.execution import sample_tasks
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.run import Run
from propel_plugins.executors import available_cores, chosen_threads

CONFIG = {  # the parts of demo.yaml the generate stage reads, at the executor's default workers
    "domain": {"name": "arithmetic"},
    "generator": {"batch_size": 16, "sampling": {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 20}},
    "seed": 0,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the benchmark")
    args = parser.parse_args()
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(args.busy)
    ]
    try:
        measure(args)
    finally:
        for process in busy:
            process.kill()
            process.wait()


def measure(args) -> None:

    registry = Registry.build()
    config = validate_config({**CONFIG, "run_dir": tempfile.mkdtemp()}, registry)
    registry.backend(config.generator)  # loaded once, outside the timed calls
    default = torch.get_num_threads()
    workers = config.executor.workers
    print(
        f"{os.cpu_count()} CPUs ({available_cores()} available), load average {os.getloadavg()[0]:.1f}, "
        f"{args.busy} busy processes beside, torch default threads {default}, {workers} workers -> chosen "
        f"{chosen_threads(workers)}"
    )
    before, now = f"before: torch's default, {default} threads", f"now: chosen, {chosen_threads(workers)} threads"
    written: dict[str, list[str]] = {}

    def arm(name: str, keep_default: bool):
        def call():
            if keep_default:
                os.environ["OMP_NUM_THREADS"] = str(default)
            try:
                run = Run(validate_config({**CONFIG, "run_dir": tempfile.mkdtemp()}, registry), registry, quiet=True)
                contexts = run.context_sampler(0).sample(args.tasks)
                tasks = sample_tasks(run.services, config.generator, contexts, Path(run.dir) / "tasks.jsonl", 0)
                written[name] = [task.generation for task in tasks]
            finally:
                os.environ.pop("OMP_NUM_THREADS", None)
                torch.set_num_threads(default)

        return call

    os.environ.pop("OMP_NUM_THREADS", None)
    times = compare({before: arm(before, True), now: arm(now, False)}, repeats=args.repeats)
    assert written[before] == written[now], "the thread count changed what was generated"
    report(f"generate {args.tasks} arithmetic tasks, local executor, {workers} workers", times, baseline=before)
    low, mid = ratio(times, before, now)
    print(f"chosen threads vs torch's default: {low:.2f}x / {mid:.2f}x faster (min / median)")


if __name__ == "__main__":
    main()
