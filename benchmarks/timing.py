"""How every benchmark here times what it compares: arms interleaved, warmed up, repeated, in the
same scheduling situation, reported as min and median with their spread, and ratios from one run.

    from timing import compare, report
    times = compare({"plain transformers (peer)": peer, "propel": ours}, repeats=5)
    report("one forward pass over 64 generated tasks", times, baseline="plain transformers (peer)")

Each round runs every arm once, in an order rotated by one each round, so load that drifts over the
run lands on every arm alike. Arms that start processes should start them the same way (each in a
new session, say: the kernel's autogroup gives a new session its own CPU share).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def compare(arms: dict[str, Callable[[], Any]], repeats: int = 5, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds of each call of each arm, ``warmup`` untimed rounds first, then ``repeats`` timed ones."""
    names = list(arms)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(warmup + repeats):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            arms[name]()
            seconds = time.perf_counter() - started
            if round_number >= warmup:
                times[name].append(seconds)
    return times


def report(what: str, times: dict[str, list[float]], baseline: str | None = None, per: tuple[int, str] | None = None):
    """Print what is compared, then per arm min and median seconds (and the spread, max-min over
    median), and each arm's speed relative to ``baseline`` (its time over the arm's: above 1 is
    faster), from the min and from the median. ``per``: (count, unit) to add a rate, e.g. (64, "tasks")."""
    print(what)
    width = max(map(len, times))
    for name, seconds in times.items():
        low, mid = min(seconds), statistics.median(seconds)
        line = f"  {name:<{width}}  min {low:8.3f} s  median {mid:8.3f} s  spread {(max(seconds) - low) / mid:5.1%}"
        if per:
            line += f"  ({per[0] / mid:.2f} {per[1]}/s)"
        if baseline and name != baseline:
            base = times[baseline]
            line += f"  speed vs {baseline}: {min(base) / low:.2f}x min, {statistics.median(base) / mid:.2f}x median"
        print(line)
    print(f"  ({len(next(iter(times.values())))} interleaved repeats per arm after warm-up)")


def ratio(times: dict[str, list[float]], slow: str, fast: str) -> tuple[float, float]:
    """How many times faster ``fast`` is than ``slow``: (from the mins, from the medians)."""
    return min(times[slow]) / min(times[fast]), statistics.median(times[slow]) / statistics.median(times[fast])
