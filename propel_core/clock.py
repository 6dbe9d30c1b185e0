"""A run's time in its own terms, so that a verdict on time does not move with the machine's load.

A program judged by the wall clock on a busy machine runs out of time for the CPU it waited for,
not for anything it did: the same correct attempt is solved on a quiet machine and failed beside a
training. :class:`RunClock` keeps three clocks for one run instead:

- **CPU time**: the seconds of CPU its processes used, children and exited processes included (the
  caller passes its cgroup's accounting; without one, the sum over the threads it was shown);
- **waited**: the seconds its threads were ready to run but had no CPU (the kernel's per-thread
  ``schedstat``, sampled every few tens of milliseconds);
- **own time**: the wall clock less what it waited, i.e. what the run would have taken on a machine
  of its own; it grows while the run sleeps or blocks, not while it queues for a CPU.

The judgement (:meth:`RunClock.over`): past ``limit`` seconds of CPU time, or ``limit`` seconds of
own time (a sleeper, a deadlock), the run is out of time (``timeout``), whatever the load; a run still
going when the wall clock reaches ``backstop`` times the limit had neither, so it spent that time
queued for a CPU: the machine's doing, a harness failure (``sandbox_error``, reason ``overloaded``),
never the program's. A program cannot queue without a busy machine: on an idle one its own threads
run on every core, so its CPU time reaches the limit first.

Where the kernel keeps no ``schedstat`` (built without scheduler statistics) nothing is known to have
waited, own time is the wall clock and the judgement falls back to CPU time and the wall clock
(:data:`WAITS_KNOWN` says which).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: the reason a harness failure for a busy machine starts with (``propel_core.execution`` reruns it)
OVERLOADED = "overloaded"
#: how often the clock reads the threads at most (seconds)
SAMPLE_EVERY = 0.05


def thread_times(tid: int) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds waiting for one) of thread ``tid``, or None if it is gone."""
    try:
        on_cpu, waiting, _ = Path(f"/proc/{tid}/schedstat").read_bytes().split()
    except (OSError, ValueError):
        return None
    return int(on_cpu) / 1e9, int(waiting) / 1e9


WAITS_KNOWN = Path("/proc/self/schedstat").exists()


@dataclass
class RunClock:
    """The clocks of one run, judged against ``limit`` seconds, the wall clock a backstop at
    ``backstop`` times that. Call :meth:`sample` while it runs and once after it ended."""

    limit: float
    backstop: float = 10.0
    started: float = field(default_factory=time.monotonic)
    cpu: float = 0.0
    waited: float = 0.0
    wall: float = 0.0
    _threads: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    _gone: tuple[float, float] = (0.0, 0.0)
    _base: tuple[float, float] = (0.0, 0.0)
    _last: float = field(default=0.0, repr=False)

    def begin(self, tids: Iterable[int]) -> RunClock:
        """Start the clocks now for threads that already ran (a worker serving one request after
        another): what they used and waited before counts for nothing."""
        self.sample(tids)
        self._base, self.started, self.cpu, self.waited, self.wall = (self.cpu, self.waited), time.monotonic(), 0, 0, 0
        return self

    def due(self) -> bool:
        """Whether a sample is due (at most one every ``SAMPLE_EVERY`` seconds)."""
        return time.monotonic() - self._last >= SAMPLE_EVERY

    def sample(self, tids: Iterable[int], cpu: float | None = None) -> None:
        """Read the threads ``tids`` the run has now; ``cpu`` is its accounted CPU time, if known. A
        thread seen before keeps its last reading when it has gone, so what it used and waited counts."""
        now = time.monotonic()
        self._last, self.wall = now, now - self.started
        for tid in tids:
            found = thread_times(tid)
            if found is None:
                continue
            before = self._threads.get(tid)
            if before is not None and found[0] < before[0]:  # the tid was reused: the old thread is done
                self._gone = (self._gone[0] + before[0], self._gone[1] + before[1])
            self._threads[tid] = found
        on_cpu = self._gone[0] + sum(seen[0] for seen in self._threads.values()) - self._base[0]
        self.waited = self._gone[1] + sum(seen[1] for seen in self._threads.values()) - self._base[1]
        self.cpu = max(on_cpu, cpu or 0.0, self.cpu)

    @property
    def own(self) -> float:
        """The wall clock less the time waited for a CPU: how long the run took in its own terms."""
        return max(0.0, self.wall - self.waited)

    def over(self, ended: bool = False) -> tuple[str, str] | None:
        """``("timeout", why)`` for a run past its limit in CPU or own time, ``("sandbox_error", why)``
        for one stopped by the backstop (``why`` starts with :data:`OVERLOADED`), None otherwise.
        ``ended``: the run has exited, so the backstop no longer applies."""
        if self.cpu > self.limit:
            return "timeout", f"CPU time limit: {self.cpu:.1f} s of CPU, the limit is {self.limit:g} s"
        if self.own > self.limit:
            return "timeout", (
                f"time limit: {self.own:.1f} s of its own time ({self.cpu:.1f} s on a CPU, the rest idle, sleeping "
                f"or blocked; {self.waited:.1f} s waiting for a CPU not counted), the limit is {self.limit:g} s"
            )
        if not ended and self.wall > self.backstop * self.limit:
            return "sandbox_error", (
                f"{OVERLOADED}: the machine was too busy to judge the run: in {self.wall:.0f} s it got "
                f"{self.cpu:.1f} s of CPU and waited {self.waited:.0f} s for one (limit {self.limit:g} s); "
                "not the program's doing"
            )
        return None

    def times(self) -> dict[str, float]:
        """The run's clocks, rounded, for a result's record."""
        return {"cpu_seconds": round(self.cpu, 3), "wait_seconds": round(self.waited, 3)}
