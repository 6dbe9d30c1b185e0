"""Do a solver's labels carry a difficulty signal? The measurement behind the frontier-shift setting.

A probe can only learn what the labels hold, and RL can only follow what the probe learned. So before
choosing the experiment's setting this script asks, for each candidate solver, how much of a task's
solve count is the task and how much is chance:

- split-half reliability: 2K attempts at each task, split into two halves of K; the Spearman
  correlation between the halves' solve counts across tasks, and how often the two halves agree on
  in band vs not, against the agreement two independent draws with the same in-band rate would
  reach, and Cohen's kappa from the two (an upper bound on what any probe can reach from the task alone);
- difficulty: the Spearman correlation between the solve rate (all 2K attempts) and the task's size
  (digits beyond the first of each operand, plus operations, plus products), a property the
  reference model can read.

Tasks: the arithmetic domain's own exercises (two per context, 1-2 operations, 1-2 digit operands).
Solvers: the embedded 135M model at the demo's sampling (temperature 0.6, top-p 0.95, top-k 20, 16
new tokens, the domain's zero-shot prompt), and the simulated ``arithmetic_skill`` solver (its success
probability a known function of the same features, see propel_arithmetic/skill.py).

    .venv/bin/python benchmarks/solver_signal.py [--k 8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from propel_core.config import validate_config
from propel_core.domain import make_task
from propel_core.execution import graded_attempts
from propel_core.plugins import Registry
from propel_core.probes.metrics import spearman
from propel_core.run import Run

SOLVERS = {
    "embedded 135M (demo sampling)": {
        "batch_size": 64,
        "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 16},
    },
    "arithmetic_skill (simulated)": {"backend": "arithmetic_skill"},
}


def size(expression: str) -> int:
    """Digits beyond the first of each operand, plus operations, plus products (* and /)."""
    from propel_arithmetic.plugin import INTEGER, OPERATOR

    operators = OPERATOR.findall(expression)
    extra = sum(len(operand) - 1 for operand in INTEGER.findall(expression))
    return extra + len(operators) + sum(op in "*/" for op in operators)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=8, help="attempts per half (2k per task)")
    args = parser.parse_args()
    registry = Registry.build()
    low, high = 1 / 8, 3 / 8
    print(f"split-half reliability of solve counts, {args.k} + {args.k} attempts per task; band [{low}, {high}]")
    columns = ("tasks", "halves rho", "band agree", "chance", "kappa", "rho(size)", "in band", "s")
    print(f"{'solver':32} " + " ".join(f"{column:>10}" for column in columns))
    for name, solver in SOLVERS.items():
        config = {
            "run_dir": tempfile.mkdtemp(),
            "seed": 0,
            "domain": {"name": "arithmetic"},
            "solver": solver,
            "executor": {"workers": 64},
        }
        run = Run(validate_config(config, registry), registry, quiet=True)
        domain = run.domain()
        predicates = run.registry.validity_predicates(domain)
        tasks = [
            make_task(f"e{i:03d}", domain, context, f"Compute: {example}", "domain examples", predicates)
            for i, (context, example) in enumerate((c, e) for c in domain.contexts() for e in c.data["examples"])
        ]
        tasks = [task for task in tasks if task.validity.valid]
        start = time.perf_counter()
        counts = {}
        for task, attempts in graded_attempts(run, tasks, 2 * args.k, run.config.solver, 0, description=name):
            solved = [bool(a.solved) for a in attempts]
            counts[task.id] = (sum(solved[: args.k]), sum(solved[args.k :]))
        seconds = time.perf_counter() - start
        first = torch.tensor([float(counts[t.id][0]) for t in tasks])
        second = torch.tensor([float(counts[t.id][1]) for t in tasks])
        in_band = lambda c: low <= c / args.k <= high  # noqa: E731
        bands = [(in_band(a), in_band(b)) for a, b in counts.values()]
        agree = statistics.fmean(a == b for a, b in bands)
        p = statistics.fmean(a for a, _ in bands + [(b, a) for a, b in bands])
        chance = p * p + (1 - p) * (1 - p)  # agreement of two independent coins with that in-band rate
        rate = (first + second) / (2 * args.k)
        sizes = torch.tensor([float(size(t.payload["expression"])) for t in tasks])
        kappa = (agree - chance) / (1 - chance)
        values = (spearman(first, second), agree, chance, kappa, spearman(rate, sizes), p, seconds)
        print(f"{name:32} {len(tasks):>10} " + " ".join(f"{value:>10.3f}" for value in values))


if __name__ == "__main__":
    main()
