"""The watcher: each test's time limit, kept from outside the process that runs the test.

It runs inside the sandbox as ``python -I -S WATCHER MARK``, beside a runner (pytest with the
report plugin, the second runner, the replayer), reading on its standard input the pipe the runner
answers on. A line ``PROPEL-CLOCK MARK PID SECONDS`` (``guard.time_limit``) starts a limit of SECONDS
of CPU time for process PID (0 ends it); every other line is passed on unchanged to the harness, for
which the pipe was meant. While a limit runs it reads the process's CPU time from ``/proc`` ten
times a second, and once the process has spent the limit it sends it SIGINT (again after as much
CPU time once more, at least a second, while the phase has not ended): the process
answers with the handler every Python process starts with, a ``KeyboardInterrupt`` at its next
bytecode, which the runner makes ``OutOfTime`` (the test failed). Before it sends it, it reads what
the runner has written since, so a phase that ended in time is not interrupted. So the process that
runs the code under test holds no timer and no handler of propel's (docs/swe.md, "Judged as used").
"""

import contextlib
import os
import select
import signal
import sys

MARK = b"PROPEL-CLOCK"
POLL = 0.1  # seconds between two looks at the process's CPU time while a limit runs
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int):
    """User and system CPU time of process ``pid`` (all its threads), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def main() -> None:
    mark = MARK + b" " + sys.argv[1].encode() + b" "
    pending, limit = b"", None  # limit: (pid, CPU seconds at its start, seconds), while one runs

    def take(data: bytes) -> None:
        nonlocal pending, limit
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            try:
                pid, seconds = line[len(mark) :].split() if line.startswith(mark) else (None, None)
                pid, seconds = int(pid), float(seconds)
            except (TypeError, ValueError):  # not the runner's: for the harness, which judges it
                os.write(1, line + b"\n")
                continue
            start = cpu_seconds(pid) if seconds > 0 else None
            limit = (pid, start, seconds) if start is not None else None

    while True:
        if select.select([0], [], [], POLL if limit else None)[0]:
            data = os.read(0, 1 << 16)
            if not data:
                break
            take(data)
        spent = cpu_seconds(limit[0]) if limit else None
        if spent is None:
            limit = None
        elif spent - limit[1] >= limit[2]:
            while select.select([0], [], [], 0)[0] and (data := os.read(0, 1 << 16)):
                take(data)  # what the runner wrote before this moment: a limit it ended is not enforced
            if limit is not None and spent - limit[1] >= limit[2]:
                with contextlib.suppress(OSError):  # it ended meanwhile
                    os.kill(limit[0], signal.SIGINT)
                # again if the phase goes on for as long once more (at least a second): an interrupt
                # that met code which swallowed it does not leave the test running to the suite's end
                limit = (limit[0], spent, max(limit[2], 1.0))
    if pending:
        os.write(1, pending)


if __name__ == "__main__":
    main()
