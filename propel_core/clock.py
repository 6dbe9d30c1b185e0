"""A run's time in its own terms, so that a verdict on time does not move with the machine's load.

A program judged by the wall clock on a busy machine runs out of time for the CPU it waited for,
not for anything it did: the same correct attempt is solved on a quiet machine and failed beside a
training. :class:`RunClock` keeps the clocks of one run instead, reading its threads every 30 to 70
ms (the moment drawn afresh each time, so a program cannot time itself to the readings):

- **CPU time**: the seconds of CPU its processes used, children and exited processes included (the
  caller passes its cgroup's accounting; without one, the sum over the threads it was shown);
- **idle time**: the time during which none of its threads was running or ready to run (sleeping,
  blocked, stopped): each stretch between two readings at whose end no thread of the run was
  runnable counts whole;
- **own time**: CPU time plus idle time, what the run would have taken on a machine of its own;
- **waited**: the seconds its threads were ready to run but had no CPU (the kernel's per-thread
  ``schedstat``), for the record and for the backstop.

The judgement (:meth:`RunClock.over`): past ``limit`` seconds of CPU time or of own time (a sleeper, a
deadlock, a program that computes and sleeps by turns) the run is out of time, ``timeout``, whatever
the load. A run still going when the wall clock reaches ``backstop`` times the limit had neither: if
its threads waited for a CPU most of that time, the machine was too busy to judge it, a harness
failure (``sandbox_error``, its reason starting :data:`OVERLOADED`), never the program's; otherwise
(it kept a thread runnable at every reading and yet did not use the CPU it had) it is ``timeout``.
A program cannot make itself ``overloaded``: on a machine with no other work a runnable thread runs,
so it waits for no CPU and its CPU time reaches the limit first; one that slowed itself down to wait
(lowered its priority or its autogroup's, took the batch or idle policy, narrowed its CPUs) is
``timeout`` at the backstop, whatever it waited. The readings fall at moments the caller's own timer
draws (``until_due``), not when the run wakes the caller, so a run cannot time itself to them.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: the reason a harness failure for a busy machine starts with
OVERLOADED = "overloaded"
#: the mean time between two readings of a run's threads (seconds); each is drawn from 0.6x to 1.4x
SAMPLE_EVERY = 0.05


def scheduling() -> tuple[int, int, frozenset[int]]:
    """The calling thread's nice, scheduling policy and CPUs: what a process it starts begins with."""
    return os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0), frozenset(os.sched_getaffinity(0))


def thread_state(
    tid: int, start: tuple[int, int, frozenset[int]]
) -> tuple[bool, float, float, bool, frozenset[int]] | None:
    """(whether it is running or ready to run, seconds on a CPU, seconds waiting for one, whether it
    lowered its priority, the CPUs it may run on) of thread ``tid``, or None if it is gone. A thread
    lowers its priority when, against what its run started with (``start``, from :func:`scheduling`),
    it takes a higher nice, its session's autogroup is niced or it takes the batch or idle policy."""
    try:
        stat = Path(f"/proc/{tid}/stat").read_bytes()
        fields = stat[stat.rindex(b")") + 2 :].split()
    except (OSError, ValueError):
        return None
    try:
        on_cpu, waiting, _ = (int(value) / 1e9 for value in Path(f"/proc/{tid}/schedstat").read_bytes().split())
    except (OSError, ValueError):  # a kernel without scheduler statistics: user + system time, no wait
        on_cpu, waiting = (int(fields[11]) + int(fields[12])) / TICKS, 0.0
    nice, policy, cpus = start
    lowered = int(fields[16]) > nice or (int(fields[38]) in LOW_POLICIES and int(fields[38]) != policy)
    allowed = cpus
    with contextlib.suppress(OSError):
        lowered = lowered or b" nice 0" not in _autogroup(tid)
        allowed = frozenset(os.sched_getaffinity(tid))
    return fields[0] == b"R", on_cpu, waiting, lowered, allowed


def _autogroup(tid: int) -> bytes:
    try:
        return Path(f"/proc/{tid}/autogroup").read_bytes()
    except OSError:  # a kernel without autogroups
        return b" nice 0"


TICKS = os.sysconf("SC_CLK_TCK")
#: SCHED_BATCH and SCHED_IDLE
LOW_POLICIES = (3, 5)


@dataclass
class RunClock:
    """The clocks of one run, judged against ``limit`` seconds, the wall clock a backstop at
    ``backstop`` times that. Call :meth:`sample` while it runs (when :meth:`due`) and once after it
    ended, with the run's accounted CPU time and no threads."""

    limit: float
    backstop: float = 20.0
    started: float = field(default_factory=time.monotonic)
    cpu: float = 0.0
    idle: float = 0.0
    waited: float = 0.0
    wall: float = 0.0
    #: whether a reading found the run slowed down by its own doing: a thread that lowered its
    #: priority, or its threads together allowed fewer CPUs than it started with (one thread pinned
    #: to each CPU, as OMP_PROC_BIND does, is not that)
    slowed: bool = False
    _threads: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False)
    _gone: tuple[float, float] = (0.0, 0.0)
    _base: tuple[float, float] = (0.0, 0.0)
    _last: float | None = field(default=None, repr=False)
    _next: float = field(default=0.0, repr=False)
    _draw: random.Random = field(default_factory=random.Random, repr=False)
    #: the scheduling a run started with (the caller's, made where the caller starts the run)
    start: tuple[int, int, frozenset[int]] = field(default_factory=scheduling, repr=False)

    #: whether stretches with no runnable thread count as idle yet: not while the caller sets the run
    #: up (a sandbox's namespaces), only from :meth:`program_started`
    judging_idle: bool = True

    def program_started(self) -> None:
        """The run's own code starts now: idle time counts from here, what came before was set-up."""
        if not self.judging_idle:
            self.judging_idle, self._last = True, time.monotonic()

    def begin(self, tids: Iterable[int]) -> RunClock:
        """Start the clocks now for threads that already ran (a worker serving one request after
        another): what they used and waited before counts for nothing."""
        self.sample(tids)
        self._base = (self.cpu + self._base[0], self.waited + self._base[1])
        self.started, self._last = time.monotonic(), time.monotonic()
        self.cpu = self.idle = self.waited = self.wall = 0.0
        return self

    def due(self) -> bool:
        """Whether a reading is due."""
        return time.monotonic() >= self._next

    def until_due(self) -> float:
        """Seconds until the next reading: the caller waits on its own timer for it, so readings fall
        at the drawn moments, never when the run wakes the caller (by writing output, say)."""
        return max(0.0, self._next - time.monotonic())

    def sample(self, tids: Iterable[int], cpu: float | None = None) -> None:
        """Read the threads ``tids`` the run has now; ``cpu`` is its accounted CPU time, if known. A
        thread seen before keeps its last reading when it has gone, so what it used and waited counts.
        Given no thread (the run has ended), the stretch since the last reading is not judged idle."""
        now = time.monotonic()
        runnable, read, allowed = False, False, frozenset()
        for tid in tids:
            found = thread_state(tid, self.start)
            if found is None:
                continue
            read, runnable, self.slowed = True, runnable or found[0], self.slowed or found[3]
            allowed |= found[4]
            before = self._threads.get(tid)
            if before is not None and found[1] < before[0]:  # the tid was reused: the old thread is done
                self._gone = (self._gone[0] + before[0], self._gone[1] + before[1])
            self._threads[tid] = found[1:3]
        self.slowed = self.slowed or (read and not self.start[2] <= allowed)
        if read and not runnable and self.judging_idle:
            self.idle += now - (self.started if self._last is None else self._last)
        self._last, self.wall = now, now - self.started
        self._next = now + SAMPLE_EVERY * self._draw.uniform(0.6, 1.4)
        on_cpu = self._gone[0] + sum(seen[0] for seen in self._threads.values()) - self._base[0]
        self.waited = self._gone[1] + sum(seen[1] for seen in self._threads.values()) - self._base[1]
        self.cpu = max(on_cpu, cpu or 0.0, self.cpu)

    @property
    def own(self) -> float:
        """CPU time plus idle time: how long the run took in its own terms."""
        return self.cpu + self.idle

    def over(self, ended: bool = False) -> tuple[str, str] | None:
        """``("timeout", why)`` for a run past its limit, ``("sandbox_error", why)`` for one the
        backstop stopped while it waited for a CPU (``why`` starts with :data:`OVERLOADED`), None
        otherwise. ``ended``: the run has exited, so the backstop no longer applies. A timeout's
        ``why`` holds no measured number, so the same run gets the same words every time; the
        numbers are the caller's to record (:meth:`times`)."""
        if self.cpu > self.limit or self.own > self.limit:  # the same words either way: a verdict's reason
            return "timeout", (  # must not depend on which reading saw it first, nor on the readings' numbers
                f"over its time limit of {self.limit:g} s (CPU time, or CPU and idle time together; time "
                "spent waiting for a CPU does not count)"
            )
        if ended or self.wall <= self.backstop * self.limit:
            return None
        if self.waited > (self.wall - self.cpu) / 2 and not self.slowed:
            return "sandbox_error", (
                f"{OVERLOADED}: the machine was too busy to judge the run: in {self.wall:.0f} s it got "
                f"{self.cpu:.1f} s of CPU and waited {self.waited:.0f} s for one (limit {self.limit:g} s); "
                "not the program's doing"
            )
        return "timeout", f"no end within the wall-clock backstop of {self.backstop * self.limit:g} s"

    def times(self) -> dict[str, float]:
        """The run's clocks, rounded, for a result's record."""
        clocks = {"cpu_seconds": self.cpu, "wait_seconds": self.waited, "own_seconds": self.own}
        return {name: round(seconds, 3) for name, seconds in clocks.items()}
