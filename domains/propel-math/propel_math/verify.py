"""Symbolic answer comparison through a separate math-verify worker process.

The worker runs with memory and CPU limits and, where bubblewrap is available, with no network and a
read-only filesystem. A request that takes longer than ``timeout``, or a worker that dies, gets the
worker killed and restarted, and the comparison reported as unknown (None), never as a wrong answer.
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
import time
import weakref


class Verifier:
    def __init__(self, timeout: float = 10.0, startup_timeout: float = 60.0, memory_mb: int = 4096):
        self.timeout, self.startup_timeout, self.memory_mb = timeout, startup_timeout, memory_mb
        self._process: subprocess.Popen | None = None

    def equal(self, gold: str, answer: str) -> bool | None:
        """Whether ``answer`` equals ``gold`` symbolically; None when the worker timed out or died
        (it is restarted on the next request)."""
        fresh = self._process is None
        process = self._process or self._start()
        try:
            process.stdin.write(json.dumps({"gold": _math(gold), "answer": _math(answer)}) + "\n")
            process.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return None
        reply = self._read_line(process, self.startup_timeout if fresh else self.timeout)
        if reply is None:
            self.close()
            return None
        return bool(json.loads(reply).get("equal"))

    def _start(self) -> subprocess.Popen:
        command = [sys.executable, "-m", "propel_math.verify_worker"]
        limits = [f"--as={self.memory_mb << 20}", f"--cpu={int(self.startup_timeout + 3600)}", "--core=0", "--"]
        if shutil.which("prlimit"):
            command = [shutil.which("prlimit"), *limits, *command]
        if shutil.which("bwrap") and os.geteuid() == 0:
            # the whole filesystem read-only (no tmpfs over /tmp: the interpreter may live there)
            command = [
                shutil.which("bwrap"),
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--unshare-net",
                "--unshare-pid",
                "--unshare-ipc",
                "--die-with-parent",
                "--",
                *command,
            ]
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        weakref.finalize(self, _kill, self._process)
        return self._process

    @staticmethod
    def _read_line(process: subprocess.Popen, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=deadline - time.monotonic()):
                    line = process.stdout.readline()
                    return line or None
        return None

    def close(self) -> None:
        if self._process is not None:
            _kill(self._process)
            self._process = None


def _kill(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _math(text: str) -> str:
    """Give the parser a math-mode string unless the text already carries its own delimiters."""
    return text if "$" in text or "\\boxed" in text else f"${text}$"
