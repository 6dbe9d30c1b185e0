"""Verdicts and throughput of the local sandbox on a busy machine: idle against 1x, 4x and 8x
oversubscription of the cores by CPU hogs, each hog in a session of its own (as other users' jobs are).

Verdicts: AZR attempts at a seed task of the domain (right, wrong, right but computing near the time
limit, an endless loop, a sleeper; the sandbox's time limit 2 s) and the AZR validity check of the
same functions as tasks, graded at every load; each load's verdicts are compared with the idle ones.
The peer is the judgement the sandbox made before (the wall clock): from the same runs, what a
wall-clock limit would have said (a run whose wall clock passed the limit is a timeout), so both
judgements see exactly the same runs.

Throughput: AZR checks per second of the domain's seed programs (as ``benchmarks/sandbox.py`` runs
them), two at a time (the executor's workers on two cores), at each load.

The loads are interleaved: each round visits every load once, in an order rotated by one each round.

    python benchmarks/sandbox_load.py [--repeats 3] [--runs 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from propel_azr.plugin import check_execution
from propel_core.plugins import Registry
from propel_core.records import Task, Validity
from propel_core.testing import cpu_hogs

TIME_LIMIT = 2.0
BURN = "import time\ndef burn(s):\n    t = time.process_time()\n    while time.process_time() - t < s: pass\n"
RIGHT = "def f(xs):\n    return max(xs) - min(xs) if xs else 0\n"
ATTEMPTS = {
    "right": RIGHT,
    "right, near its limit": BURN + "def f(xs):\n    burn(0.12)\n    return max(xs) - min(xs) if xs else 0\n",
    "wrong": "def f(xs):\n    return max(xs)\n",
    "endless loop": "def f(xs):\n    while True:\n        pass\n",
    "sleeper": "import time\ndef f(xs):\n    time.sleep(10 ** 6)\n",
}
LOADS = {"idle": 0, "1x": 1, "4x": 4, "8x": 8}


def task(code: str) -> Task:
    payload = {"code": code, "inputs": [[[i, i * i % 7, 3]] for i in range(10)], "message": "hint"}
    return Task(
        id="a", domain="azr", context_id="c", generation="", payload=payload, validity=Validity.ok(), generator="m"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=16, help="AZR checks per throughput measurement")
    args = parser.parse_args()

    domain = Registry.build().domain("azr", sandbox_options={"time_limit": TIME_LIMIT})
    reference = task(RIGHT)
    assert check_execution(reference, domain).valid
    seeds = [context.data for context in domain.contexts()]
    programs = [(seeds[i % len(seeds)]["code"], seeds[i % len(seeds)]["inputs"]) for i in range(args.runs)]

    sandbox = domain.sandbox
    runs: list[tuple[float, float]] = []  # (wall clock, limit) of each sandboxed run of the verdict at hand
    run_python = sandbox.run_python

    def recorded(files, main, hash_seed=0, time_limit=None):
        result = run_python(files, main, hash_seed=hash_seed, time_limit=time_limit)
        runs.append((result.duration, time_limit or sandbox.time_limit))
        return result

    sandbox.run_python = recorded

    def verdicts() -> dict[str, tuple]:
        """name -> (verdict, the sandbox's status, the verdict a wall-clock limit would have given)."""
        found = {}
        for name, code in ATTEMPTS.items():  # one at a time, as one executor worker grades
            runs.clear()
            verdict = domain.grade(reference.payload, f"```python\n{code}```")
            late = any(wall > limit for wall, limit in runs)
            found[f"answer: {name}"] = (
                verdict.solved,
                verdict.diagnostics.get("sandbox_status"),
                verdict.solved and not late,
            )
            runs.clear()
            validity = check_execution(task(code), domain)
            late = any(wall > limit for wall, limit in runs)
            found[f"task: {name}"] = (
                validity.valid,
                (validity.reason or "ok").split(":")[0],
                validity.valid and not late,
            )
        return found

    def throughput() -> float:
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: domain.execute(p[0], p[1]), programs))
        return len(programs) / (time.monotonic() - started)

    idle = verdicts()  # the reference verdicts, and a warm-up
    agree: dict[str, list[int]] = {load: [] for load in LOADS}
    wall_agree: dict[str, list[int]] = {load: [] for load in LOADS}
    rates: dict[str, list[float]] = {load: [] for load in LOADS}
    moved: set[str] = set()
    names = list(LOADS)
    for round_number in range(args.repeats):
        shift = round_number % len(names)
        for load in names[shift:] + names[:shift]:
            with cpu_hogs(LOADS[load], own_sessions=True):
                rates[load].append(throughput())
                found = verdicts()
            agree[load].append(sum(found[n][:2] == idle[n][:2] for n in idle))
            wall_agree[load].append(sum(found[n][2] == idle[n][0] for n in idle))
            moved |= {f"{load} {n}: {found[n][:2]} (idle {idle[n][:2]})" for n in idle if found[n][:2] != idle[n][:2]}
            print(f"round {round_number + 1} {load}: {agree[load][-1]}/{len(idle)} verdicts as idle", flush=True)

    print(
        f"\nVerdicts of {len(idle)} AZR attempts and tasks (time limit {TIME_LIMIT:g} s) against the idle ones, and "
        "what a wall-clock limit (the peer: the sandbox before) would have said of the same runs; AZR checks/s two at "
        f"a time; {args.repeats} interleaved rounds per load, hogs in sessions of their own:"
    )
    base = statistics.median(rates["idle"])
    for load in names:
        print(
            f"  {load:>4}: CPU/own-time verdicts as idle {min(agree[load])}/{len(idle)} (min over rounds), "
            f"wall-clock verdicts as idle {min(wall_agree[load])}/{len(idle)}; "
            f"throughput min {min(rates[load]):5.2f} median {statistics.median(rates[load]):5.2f} checks/s "
            f"({statistics.median(rates[load]) / base:.2f}x of idle's median)"
        )
    for line in sorted(moved):
        print("  moved:", line)


if __name__ == "__main__":
    main()
