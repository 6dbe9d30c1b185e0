"""Symbolic answer comparison through separate math-verify worker processes.

Each worker runs with memory and CPU limits and, where bubblewrap is available, with no network and a
read-only filesystem. Graders are called from many threads at once, so a request takes a worker of
its own from a pool (starting one when none is idle) and gives it back when answered: no two threads
ever share a worker's pipes. At most one request per CPU core runs at a time (the others wait for a
slot before their clock starts), so the verifier's own load never eats into a request's ``timeout``.
A request's time is judged as the sandbox judges a run (``propel_core.clock``): by the worker's CPU
time and own time, not the time it queued for a CPU on a busy machine. A request past ``timeout``, or
a worker that dies, gets that worker killed (the others go on) and the comparison reported as unknown
(None); one that the machine kept from running for ten times ``timeout`` raises ``Overloaded``, and
the grader makes the attempt ungradable (the stages grade it again). A worker lives
as long as propel's process or ``MAX_REQUESTS`` requests; it never depends on the thread that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from propel_core import RunClock
from propel_plugins.executors import available_cores

MAX_REQUESTS = 200  # a worker's CPU limit (an hour) covers this many requests of the longest timeout


class Overloaded(Exception):
    """The machine was too busy for the verifier to answer: no verdict on the answer either way."""


class Verifier:
    def __init__(self, timeout: float = 10.0, startup_timeout: float = 60.0, memory_mb: int = 4096):
        self.timeout, self.startup_timeout, self.memory_mb = timeout, startup_timeout, memory_mb
        self._idle: list[Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(available_cores())  # its CPU affinity and quota, not the machine's

    def equal(self, gold: str, answer: str) -> bool | None:
        """Whether ``answer`` equals ``gold`` symbolically; None when the worker timed out or died
        (another one serves later requests)."""
        with self._slots:
            worker = self._worker()
            reply = worker.ask({"gold": _math(gold), "answer": _math(answer)})
        if reply is None or worker.requests >= MAX_REQUESTS:
            worker.close()
        else:
            with self._lock:
                self._idle.append(worker)
        return None if reply is None else bool(reply.get("equal"))

    def _worker(self) -> Worker:
        """An idle worker that is still alive, or a new one."""
        while True:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                return Worker(self)
            if worker.process.poll() is None:
                return worker
            worker.close()

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.close()


class Worker:
    """One math-verify process, used by one thread at a time."""

    def __init__(self, verifier: Verifier):
        command = [sys.executable, "-m", "propel_math.verify_worker"]
        limits = [f"--as={verifier.memory_mb << 20}", f"--cpu={int(verifier.startup_timeout + 3600)}", "--core=0"]
        if shutil.which("prlimit"):
            command = [shutil.which("prlimit"), *limits, "--", *command]
        if shutil.which("bwrap") and os.geteuid() == 0:
            # the whole filesystem read-only (no tmpfs over /tmp: the interpreter may live there). No
            # --die-with-parent: that ties the worker to the thread that started it, and a grading
            # thread may end while the pool keeps the worker; it ends when its stdin closes instead
            isolation = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "--unshare-pid"]
            command = [shutil.which("bwrap"), *isolation, "--unshare-ipc", "--", *command]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        os.set_blocking(self.process.stdout.fileno(), False)
        self.startup_timeout, self.timeout = verifier.startup_timeout, verifier.timeout
        self.ready = False  # the worker says when it has started; the first request waits for that first
        self.requests = 0
        self._pids: list[int] = []
        weakref.finalize(self, _kill, self.process)

    def ask(self, request: dict) -> dict | None:
        """The worker's reply to ``request``, or None when it did not start within ``startup_timeout``
        or gave no reply within ``timeout``."""
        if not self.ready:
            self.ready = _read_line(self.process.stdout.fileno(), *_within(self.startup_timeout)) is not None
            if not self.ready:
                return None
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            return None
        line = self._reply()
        self.requests += 1
        try:
            return json.loads(line) if line is not None else None
        except ValueError:
            return None

    def _reply(self) -> bytes | None:
        """The reply's line, or None once the request has used ``timeout`` of CPU or own time."""
        clock = RunClock(self.timeout).begin(self._threads())

        def spent() -> bool:
            if not clock.due():
                return False
            clock.sample(self._threads())
            if (over := clock.over()) is not None and over[0] != "timeout":
                raise Overloaded(f"{over[1]} (the math verifier)")
            return over is not None

        return _read_line(self.process.stdout.fileno(), clock.until_due, spent)

    def _threads(self) -> list[int]:
        """The threads of every process of the worker's session (bubblewrap's, prlimit's, Python's)."""
        if not self._pids:  # the worker starts no process after it has started
            self._pids = _session(self.process.pid)
        tids = []
        for pid in self._pids:
            with contextlib.suppress(OSError):
                tids += [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
        return tids

    def close(self) -> None:
        _kill(self.process)


def _session(sid: int) -> list[int]:
    """The processes of session ``sid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{name}/stat").read_bytes()
                if int(stat[stat.rindex(b")") + 2 :].split()[3]) == sid:
                    found.append(int(name))
    return found


def _read_line(fd: int, wait: Callable[[], float], spent: Callable[[], bool]) -> bytes | None:
    """One whole line from ``fd`` (non-blocking), or None at the end of the stream or once ``spent()``
    says the time is up, asked whenever ``wait()`` seconds pass without data and after each chunk."""
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            if selector.select(timeout=wait()):
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    return None
                data += chunk
            if spent():
                return None
    return data


def _within(seconds: float) -> tuple[Callable[[], float], Callable[[], bool]]:
    """``wait`` and ``spent`` for ``_read_line`` on the wall clock: the worker's start, not a verdict."""
    deadline = time.monotonic() + seconds
    return (lambda: max(0.0, deadline - time.monotonic())), (lambda: time.monotonic() >= deadline)


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    for pipe in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            pipe.close()


def _math(text: str) -> str:
    """Give the parser a math-mode string unless the text already carries its own delimiters."""
    return text if "$" in text or "\\boxed" in text else f"${text}$"
