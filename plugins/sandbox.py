"""The ``local`` sandbox: runs untrusted Python (everything a model writes) in layered isolation.

Layers, each one a separate defence:

1. bubblewrap: new pid, network, ipc and uts namespaces (no network at all; a pid namespace whose
   death kills every process in it, double forks and ``setsid`` included), a read-only view of the
   system and the interpreter, the fresh temporary workdir as the only writable place, no ``/tmp``,
   a cleared environment.
2. A real unprivileged uid (65534 by default) with no groups, no capabilities and no_new_privs,
   set by ``setpriv`` inside the sandbox, so the process is not root anywhere and RLIMIT_NPROC holds.
3. Resource limits: address space, CPU seconds, file size, open files, processes.
4. The harness: a wall-clock timeout, output capped in bytes, the whole tree killed at the end.

The program reports its result by writing JSON to ``result.json`` in its workdir; the harness reads
it back as data with ``json.loads`` and never evaluates anything the sandbox returns.

Missing layers (no bubblewrap, not root) make the sandbox refuse to run unless ``allow_unisolated``
is set, in which case it runs with the layers it has and logs what is missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from propel_core import hookimpl
from propel_core.errors import PropelError

log = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "oom", "output_limit", "crashed", "no_result", "sandbox_error")
RESULT_FILE = "result.json"
PYTHON_MOUNT = "/python"  # where the interpreter's prefix appears inside the sandbox


@hookimpl
def register_sandboxes(register):
    register("local", LocalSandbox)


class SandboxUnavailable(PropelError):
    """An isolation layer is missing and the config did not allow running without it."""


@dataclass
class SandboxResult:
    status: str
    returncode: int | None = None
    result: Any = None
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    detail: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class LocalSandbox:
    def __init__(
        self,
        time_limit: float = 10.0,
        memory_mb: int = 512,
        max_output_bytes: int = 1 << 20,
        max_file_bytes: int = 16 << 20,
        max_open_files: int = 64,
        max_processes: int = 16,
        max_result_bytes: int = 1 << 20,
        uid: int = 65534,
        allow_unisolated: bool = False,
    ):
        self.time_limit = time_limit
        self.memory_bytes = memory_mb << 20
        self.max_output_bytes = max_output_bytes
        self.max_file_bytes = max_file_bytes
        self.max_open_files = max_open_files
        self.max_processes = max_processes
        self.max_result_bytes = max_result_bytes
        self.uid = uid
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.prlimit = shutil.which("prlimit")
        if self.prlimit is None:
            raise SandboxUnavailable("the local sandbox needs prlimit (util-linux) to set resource limits")
        missing = self.missing_layers()
        if missing and not allow_unisolated:
            raise SandboxUnavailable(
                f"the local sandbox is missing: {'; '.join(missing)}. Install bubblewrap "
                "(apt-get install -y bubblewrap) and run as root so it can drop to an unprivileged uid, "
                "or set allow_unisolated: true in the sandbox options to run with fewer layers"
            )
        if missing:
            log.warning("local sandbox running WITHOUT: %s", "; ".join(missing))

    def missing_layers(self) -> list[str]:
        missing = []
        if sys.platform != "linux":
            missing.append("Linux namespaces (not on Linux)")
        if self.bwrap is None:
            missing.append("bubblewrap (namespaces, read-only filesystem, no network)")
        if os.geteuid() != 0 or self.setpriv is None:
            missing.append("switching to an unprivileged uid (needs root and setpriv)")
        return missing

    @property
    def isolated(self) -> bool:
        return not self.missing_layers()

    def run_python(
        self, files: dict[str, str], main: str, hash_seed: int = 0, time_limit: float | None = None
    ) -> SandboxResult:
        """Run ``python -I main`` in a fresh workdir holding ``files``; read ``result.json`` back."""
        with tempfile.TemporaryDirectory(prefix="propel-sandbox-") as tmp:
            workdir = Path(tmp) / "work"
            workdir.mkdir()
            for name, text in files.items():
                (workdir / name).write_text(text)
            if self.isolated:
                os.chown(workdir, self.uid, self.uid)  # files stay root-owned: readable, not writable
            command, env = self._command(workdir, main, hash_seed)
            return self._execute(command, env, workdir, time_limit or self.time_limit)

    # -- the command ------------------------------------------------------------------------------

    def _command(self, workdir: Path, main: str, hash_seed: int) -> tuple[list[str], dict[str, str]]:
        """The command line and the environment it starts with.

        ``-S -B``: the standard library only (no site-packages, no ``.pth`` start-up code), no
        bytecode files. Not ``-I``: isolated mode would ignore PYTHONHASHSEED, and the environment is
        ours entirely anyway (cleared by bubblewrap, or replaced by Popen). The limits are set by
        ``prlimit`` right before the interpreter, so they bind the untrusted process and its children.
        """
        inner = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": str(hash_seed), "PYTHONDONTWRITEBYTECODE": "1"}
        limits = [
            self.prlimit,
            f"--cpu={int(self.time_limit) + 1}",
            f"--as={self.memory_bytes}",
            f"--fsize={self.max_file_bytes}",
            f"--nofile={self.max_open_files}",
            f"--nproc={self.max_processes}",
            "--core=0",
            "--",
        ]
        if not self.isolated:
            env = {**inner, "HOME": str(workdir), "TMPDIR": str(workdir)}
            return [*limits, sys.executable, "-S", "-B", main], env
        command = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        command += ["--unshare-cgroup-try", "--new-session", "--die-with-parent", "--clearenv"]
        command += ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib64", "sbin"):
            path = Path("/") / top
            if path.is_symlink():
                command += ["--symlink", os.readlink(path), str(path)]
            elif path.exists():
                command += ["--ro-bind", str(path), str(path)]
        command += ["--ro-bind", sys.base_prefix, PYTHON_MOUNT, "--proc", "/proc", "--dev", "/dev"]
        command += ["--bind", str(workdir), "/work", "--chdir", "/work"]
        for key, value in {**inner, "HOME": "/work", "TMPDIR": "/work"}.items():
            command += ["--setenv", key, value]
        command += [self.setpriv, f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--no-new-privs"]
        command += ["--bounding-set=-all", "--inh-caps=-all", *limits, _python_in_mount(), "-S", "-B", main]
        return command, {"PATH": "/usr/bin:/bin"}

    # -- running it ---------------------------------------------------------------------------------

    def _execute(self, command: list[str], env: dict[str, str], workdir: Path, time_limit: float) -> SandboxResult:
        started = time.monotonic()
        status_read, status_write = os.pipe()
        if self.isolated:
            command = [command[0], "--json-status-fd", str(status_write), *command[1:]]
        try:
            process = subprocess.Popen(
                command,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(status_write,),
            )
        except OSError as exc:
            os.close(status_read)
            os.close(status_write)
            return SandboxResult("sandbox_error", detail=f"could not start: {exc}")
        os.close(status_write)
        stdout, stderr, stopped = self._collect(process, started + time_limit)
        self._kill(process)
        returncode = process.wait()
        started_ok = self._container_started(status_read)
        result = SandboxResult(
            status="ok",
            returncode=returncode,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            duration=time.monotonic() - started,
        )
        result.status, result.detail = self._classify(result, stopped, started_ok)
        if result.status == "ok":
            result.status, result.result, result.detail = self._read_result(workdir)
        return result

    def _collect(self, process: subprocess.Popen, deadline: float) -> tuple[bytes, bytes, str | None]:
        """Read both pipes until exit, the deadline, or the output cap; say which stopped it."""
        chunks = {process.stdout: bytearray(), process.stderr: bytearray()}
        with selectors.DefaultSelector() as selector:
            for pipe in chunks:
                selector.register(pipe, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return bytes(chunks[process.stdout]), bytes(chunks[process.stderr]), "timeout"
                for key, _ in selector.select(timeout=min(remaining, 0.5)):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    chunks[key.fileobj] += data
                    if sum(map(len, chunks.values())) > self.max_output_bytes:
                        return bytes(chunks[process.stdout]), bytes(chunks[process.stderr]), "output_limit"
        # pipes closed: the program exited (or closed them); give it until the deadline to finish
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return bytes(chunks[process.stdout]), bytes(chunks[process.stderr]), "timeout"
        return bytes(chunks[process.stdout]), bytes(chunks[process.stderr]), None

    def _kill(self, process: subprocess.Popen) -> None:
        """Kill the session. Inside bubblewrap the pid namespace dies with it, taking every process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pipe in (process.stdout, process.stderr):
            pipe.close()

    def _container_started(self, status_read: int) -> bool:
        with os.fdopen(status_read, "rb") as status:
            text = status.read().decode(errors="replace")
        return not self.isolated or '"child-pid"' in text

    def _classify(self, result: SandboxResult, stopped: str | None, started_ok: bool) -> tuple[str, str | None]:
        if not started_ok:
            return "sandbox_error", result.stderr.strip()[-500:] or "bubblewrap did not start the program"
        if stopped == "timeout":
            return "timeout", f"no exit within {self.time_limit:g} s wall clock"
        if stopped == "output_limit":
            return "output_limit", f"stdout + stderr exceeded {self.max_output_bytes} bytes"
        code = result.returncode
        if code == 0:
            return "ok", None
        if "MemoryError" in result.stderr[-2000:]:
            return "oom", f"memory limit of {self.memory_bytes >> 20} MiB"
        signal_number = -code if code < 0 else code - 128 if code > 128 else None
        if signal_number is not None:
            if signal_number == signal.SIGXCPU:
                return "timeout", "CPU time limit"
            if signal_number == signal.SIGXFSZ:
                return "output_limit", f"a file exceeded {self.max_file_bytes} bytes"
            return "crashed", f"killed by signal {signal.Signals(signal_number).name}"
        return "error", result.stderr.strip().splitlines()[-1][:500] if result.stderr.strip() else f"exit {code}"

    def _read_result(self, workdir: Path) -> tuple[str, Any, str | None]:
        path = workdir / RESULT_FILE
        if not path.is_file() or path.is_symlink():
            return "no_result", None, "the program exited without writing its result"
        if path.stat().st_size > self.max_result_bytes:
            return "output_limit", None, f"result larger than {self.max_result_bytes} bytes"
        try:
            return "ok", json.loads(path.read_bytes()), None
        except (ValueError, RecursionError) as exc:
            return "no_result", None, f"result is not valid JSON: {type(exc).__name__}"


def _python_in_mount() -> str:
    """The interpreter's path inside the sandbox, where ``sys.base_prefix`` is mounted at PYTHON_MOUNT."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (version, "python3"):
        if (Path(sys.base_prefix) / "bin" / candidate).exists():
            return f"{PYTHON_MOUNT}/bin/{candidate}"
    raise SandboxUnavailable(f"no interpreter under {sys.base_prefix}/bin")
