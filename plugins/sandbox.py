"""The ``local`` sandbox: runs untrusted Python (everything a model writes) in layered isolation.

Layers, each one a separate defence:

1. bubblewrap: new pid, network, ipc and uts namespaces (no network at all; a pid namespace whose
   death kills every process in it, double forks and ``setsid`` included), a read-only view of the
   system and the interpreter, the fresh temporary workdir as the only writable place, no ``/tmp``,
   a cleared environment.
2. A real unprivileged uid (65534 by default) with no groups, no capabilities and no_new_privs,
   set by ``setpriv`` inside the sandbox, so the process is not root anywhere and RLIMIT_NPROC holds.
3. Resource limits: address space, CPU seconds, file size, open files, processes; a uid of its own
   per run (so the process limit is per run), and a workdir on a tmpfs of its own with a size and
   an inode budget (so the host's disk is never touched). Address randomization is off (``setarch
   -R``), so each run is reproducible: the same program and input give the same memory layout.
4. The harness: a wall-clock timeout, output capped in bytes, every process of the run's uid killed
   and gone before the workdir is removed.

The program reports its result by writing JSON to ``result.json`` in its workdir; the harness reads
it back as data with ``json.loads`` and never evaluates anything the sandbox returns.

Missing layers (no bubblewrap, not root) make the sandbox refuse to run unless ``allow_unisolated``
is set, in which case it runs with the layers it has and logs what is missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import math
import os
import random
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from propel_core import SANDBOX_STATUSES, PropelError, RunClock, Unavailable, hookimpl
from propel_plugins import bounds

log = logging.getLogger(__name__)

STATUSES = SANDBOX_STATUSES
RESULT_FILE = "result.json"
PYTHON_MOUNT = "/python"  # where the interpreter's prefix appears inside the sandbox


@hookimpl
def register_sandboxes(register):
    register("local", LocalSandbox)


class SandboxUnavailable(Unavailable):
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
    #: seconds of CPU the run's processes used (children and exited ones included)
    cpu_seconds: float = 0.0
    #: seconds its threads were ready to run and waited for a CPU (the machine's load, not the run)
    wait_seconds: float = 0.0
    #: what its time limit was judged on: CPU time plus idle time (``RunClock.own``); None where no
    #: clock judged it (a result made without running anything)
    own_seconds: float | None = None

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
        disk_mb: int = 64,
        max_files: int = 2048,
        uid: int = 200000,
        uid_count: int = 4096,
        allow_unisolated: bool = False,
        python_env: str | None = None,
        hide: list[str] | None = None,
        backstop: float = 20.0,
    ):
        if backstop < 2:
            raise PropelError(f"the sandbox's backstop is a multiple of the time limit of at least 2; got {backstop}")
        self.time_limit, self.backstop = time_limit, backstop
        self.memory_bytes = memory_mb << 20
        self.max_output_bytes = max_output_bytes
        self.max_file_bytes = max_file_bytes
        self.max_open_files = max_open_files
        self.max_processes = max_processes
        self.max_result_bytes = max_result_bytes
        self.disk_bytes = disk_mb << 20
        self.max_files = max_files
        self.uids = range(uid, uid + uid_count)
        self.python_env = Path(python_env) if python_env else Path(sys.prefix)
        found = [path for name in ("python", "python3") if (path := self.python_env / "bin" / name).exists()]
        if not found:
            raise PropelError(f"python_env {self.python_env} has no bin/python (give a virtual environment)")
        self.interpreter = found[0]
        self.hide = [str(Path(path)) for path in hide or ()]
        if bad := [path for path in self.hide if not (Path(path).is_absolute() and Path(path).is_dir())]:
            raise PropelError(f"the sandbox's hide option names folders by absolute path; these are not: {bad[:5]}")
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.prlimit, self.setarch = shutil.which("prlimit"), shutil.which("setarch")
        if self.prlimit is None or self.setarch is None:
            raise SandboxUnavailable(
                "the local sandbox needs prlimit and setarch (util-linux) to set resource limits and "
                "to turn address randomization off"
            )
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
            missing.append("a uid of its own per run and a bounded workdir (needs root and setpriv)")
        elif why := bounds.missing():
            missing.append(f"a memory cgroup per run ({why})")
        if sys.platform == "linux" and bounds.no_user_namespaces() is None:
            missing.append(f"a seccomp filter against user namespaces (none for {os.uname().machine})")
        return missing

    @property
    def isolated(self) -> bool:
        return not self.missing_layers()

    def run_python(
        self, files: dict[str, str], main: str, hash_seed: int = 0, time_limit: float | None = None
    ) -> SandboxResult:
        """Run ``python -S -B main`` in a fresh workdir holding ``files``; read ``result.json`` back."""
        with Cell(self) as cell, Launch(self.isolated) as launch:
            workdir = cell.folder
            for name, text in files.items():  # root-owned: readable, not writable, by the run's uid
                # as UTF-8, lone surrogates kept as the invalid bytes they stand for: the program fails
                # on them as it would on such a file, and the harness does not
                (workdir / name).write_bytes(text.encode("utf-8", "surrogatepass"))
            command, env = self._command(workdir, main, hash_seed, cell.uid, launch)
            return self._execute(command, env, cell, launch, time_limit or self.time_limit)

    def workspace(self, path: Path | None = None, image: str | None = None, workdir: str = "/testbed") -> Workspace:
        """A fresh copy of the checkout at ``path``, seen at ``workdir`` by every command run in it."""
        if path is None:
            raise PropelError(f"the local sandbox copies a checkout from a path; {image!r} is an image (use docker)")
        return Workspace(self, Path(path), workdir)

    # -- the command ------------------------------------------------------------------------------

    def _command(
        self, workdir: Path, main: str, hash_seed: int, uid: int, launch: Launch
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and the environment it starts with.

        ``-S -B``: the standard library only (no site-packages, no ``.pth`` start-up code), no
        bytecode files. Not ``-I``: isolated mode would ignore PYTHONHASHSEED, and the environment is
        ours entirely anyway (cleared by bubblewrap, or replaced by Popen). The limits are set by
        ``prlimit`` right before the interpreter, so they bind the untrusted process and its children.
        """
        inner = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": str(hash_seed), "PYTHONDONTWRITEBYTECODE": "1"}
        if not self.isolated:
            env = {**inner, "HOME": str(workdir), "TMPDIR": str(workdir)}
            return [*self._limits(), sys.executable, "-S", "-B", main], env
        mounts = ["--ro-bind", sys.base_prefix, PYTHON_MOUNT, "--bind", str(workdir), "/work"]
        env = {**inner, "HOME": "/work", "TMPDIR": "/work"}
        argv = self._isolated(mounts, "/work", env, [_python_in_mount(), "-S", "-B", main], uid, launch)
        return argv, {"PATH": "/usr/bin:/bin"}

    def run_command(
        self, command: str, binds: dict[str, Path], cwd: str, cell: Cell, time_limit: float | None = None
    ) -> SandboxResult:
        """Run ``bash -c command`` with each host folder of ``binds`` writable at its sandbox path (one
        of them at ``/tmp``) and the ``python_env`` virtual environment (the repository's test
        dependencies; this interpreter's environment by default) read-only at its own path and first
        on ``PATH``, as the uid of ``cell`` (which holds the folders), each folder of ``hide`` seen
        empty; the rest as in ``run_python``.
        Fails closed: without every isolation layer it refuses, whatever ``allow_unisolated`` says."""
        missing = self.missing_layers()
        if missing:
            raise SandboxUnavailable(f"repository commands need every isolation layer; missing: {'; '.join(missing)}")
        mounts = []
        for inside, host in binds.items():  # first: the environment may live under the host's /tmp
            mounts += ["--bind", str(host), inside]
        base = Path(os.path.realpath(self.interpreter)).parent.parent
        for prefix in dict.fromkeys((str(base), str(self.python_env))):  # a venv links to its base interpreter
            for parent in reversed(Path(prefix).parents[:-1]):  # traversable even where the host's is not
                mounts += ["--perms", "0755", "--dir", str(parent)]
            mounts += ["--ro-bind", prefix, prefix]
        for path in self.hide:  # an empty read-only folder over each: data the code must not read
            mounts += ["--tmpfs", path, "--remount-ro", path]
        env = {
            "PATH": f"{self.python_env}/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
        }
        time_limit = time_limit or self.time_limit
        with Launch(isolated=True) as launch:
            argv = self._isolated(mounts, cwd, env, ["/bin/bash", "-c", command], cell.uid, launch, time_limit)
            return self._execute(argv, {"PATH": "/usr/bin:/bin"}, cell, launch, time_limit, read_result=False)

    def _limits(self, time_limit: float | None = None) -> list[str]:
        return [
            self.prlimit,
            f"--cpu={int(time_limit or self.time_limit) + 1}",
            f"--as={self.memory_bytes}",
            f"--fsize={self.max_file_bytes}",
            f"--nofile={self.max_open_files}",
            f"--nproc={self.max_processes}",
            "--core=0",
            "--",
            self.setarch,  # no address randomization: the same program on the same input lays out its
            os.uname().machine,  # memory the same way in every run (an id() or a set of objects is
            "-R",  # reproducible, so validity and grading cannot disagree by chance)
        ]

    def _isolated(
        self,
        mounts: list[str],
        cwd: str,
        env: dict[str, str],
        argv: list[str],
        uid: int,
        launch: Launch,
        time_limit: float | None = None,
    ) -> list[str]:
        """bubblewrap (namespaces, read-only system, ``mounts``, the seccomp filter), then the IPC cap,
        then setpriv, then prlimit, then ``argv``."""
        command = [self.bwrap, "--seccomp", str(launch.seccomp), "--unshare-ipc", "--unshare-pid", "--unshare-net"]
        command += ["--unshare-uts"]
        command += ["--unshare-cgroup-try", "--new-session", "--die-with-parent", "--clearenv"]
        command += ["--ro-bind", "/usr", "/usr"]
        for top in ("bin", "lib", "lib64", "sbin"):
            path = Path("/") / top
            if path.is_symlink():
                command += ["--symlink", os.readlink(path), str(path)]
            elif path.exists():
                command += ["--ro-bind", str(path), str(path)]
        command += ["--proc", "/proc", "--dev", "/dev", *mounts, "--chdir", cwd]
        for key, value in env.items():
            command += ["--setenv", key, value]
        command += [*bounds.ipc_cap(launch.ready_write), self.setpriv, f"--reuid={uid}", f"--regid={uid}"]
        command += ["--clear-groups", "--no-new-privs"]
        return [*command, "--bounding-set=-all", "--inh-caps=-all", *self._limits(time_limit), *argv]

    # -- running it ---------------------------------------------------------------------------------

    def _execute(
        self,
        command: list[str],
        env: dict[str, str],
        cell: Cell,
        launch: Launch,
        time_limit: float,
        read_result: bool = True,
    ) -> SandboxResult:
        started = time.monotonic()
        group = None
        try:
            if launch.isolated:  # the run's cgroup, joined before bubblewrap starts
                group = bounds.RunGroup(self.memory_bytes + self.disk_bytes, self.max_processes + EXTRA_TASKS)
                command = [*group.launcher(), *command]
            process = subprocess.Popen(
                command,
                cwd=cell.folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=launch.passed,
            )
        except OSError as exc:
            if group is not None:
                group.close()
            return SandboxResult("sandbox_error", detail=f"could not start: {exc}")
        launch.started()
        clock = RunClock(time_limit, self.backstop, started=started, judging_idle=False)
        stdout, stderr, stopped = self._collect(process, clock, group, launch)
        self._kill(process)
        returncode = process.wait()
        oom = False
        if group is not None:  # every process of the run is gone before anything is read or removed
            cell.stuck |= not group.reap()
            oom = group.oom_killed()
        clock.sample((), group.cpu_seconds() if group is not None else None)  # the accounting, final
        if group is not None:
            group.close()
        if stopped is None:  # it ended by itself: judged on its clocks as they ended
            stopped = clock.over(ended=True)
        result = SandboxResult(
            status="ok",
            returncode=returncode,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
            duration=clock.wall,
            **clock.times(),
        )
        result.status, result.detail = self._classify(result, stopped, launch.ready(), oom, read_result)
        if result.status == "ok" and read_result:
            result.status, result.result, result.detail = self._read_result(cell.folder)
        if result.status != "sandbox_error" and (full := cell.exhausted()):
            result.status, result.detail = "disk_limit", full
        return result

    def _collect(
        self, process: subprocess.Popen, clock: RunClock, group: bounds.RunGroup | None, launch: Launch
    ) -> tuple[bytes, bytes, tuple[str, str] | None]:
        """Read both pipes until the run exits, goes over its time (:class:`RunClock`: CPU time, own
        time, the wall-clock backstop) or over the output cap; say which stopped it, as (status, why)."""
        chunks = {process.stdout: bytearray(), process.stderr: bytearray()}

        def out(stopped: tuple[str, str] | None) -> tuple[bytes, bytes, tuple[str, str] | None]:
            return bytes(chunks[process.stdout]), bytes(chunks[process.stderr]), stopped

        with selectors.DefaultSelector() as selector:
            for pipe in chunks:
                selector.register(pipe, selectors.EVENT_READ)
            while True:
                if clock.due():
                    if launch.ready():  # bubblewrap's set-up is over: the program's own idle time counts
                        clock.program_started()
                    if group is not None:
                        clock.sample(group.threads(), group.cpu_seconds())
                    else:
                        clock.sample(_threads_of(process.pid))
                    if verdict := clock.over():
                        return out(verdict)
                if not selector.get_map():  # pipes closed: the program exited (or closed them)
                    try:
                        process.wait(timeout=clock.until_due())
                        return out(None)
                    except subprocess.TimeoutExpired:
                        continue
                for key, _ in selector.select(timeout=clock.until_due()):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    chunks[key.fileobj] += data
                    if sum(map(len, chunks.values())) > self.max_output_bytes:
                        return out(("output_limit", f"stdout + stderr exceeded {self.max_output_bytes} bytes"))

    def _kill(self, process: subprocess.Popen) -> None:
        """Kill the session. Inside bubblewrap the pid namespace dies with it, taking every process."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pipe in (process.stdout, process.stderr):
            pipe.close()

    def _classify(
        self, result: SandboxResult, stopped: tuple[str, str] | None, started_ok: bool, oom: bool, program: bool
    ) -> tuple[str, str | None]:
        """The status of a run. For a ``program`` (``run_python``) an exit by signal means the limit
        behind it; a command's exit code is whatever the code it ran chose (``exit 152`` is not a CPU
        limit), so only what the harness itself saw (its deadline, the output cap, the kernel's kill
        at the run's memory bound) is more than an error there."""
        if not started_ok:
            return "sandbox_error", result.stderr.strip()[-500:] or "bubblewrap did not start the program"
        if stopped is not None:
            return stopped
        code = result.returncode
        if code == 0:
            return "ok", None
        if oom:
            return "oom", f"the run's memory bound of {(self.memory_bytes + self.disk_bytes) >> 20} MiB (its cgroup)"
        if not program:
            return "error", f"exit {code}"
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
            return "ok", plain_json(path.read_bytes()), None
        except (ValueError, RecursionError) as exc:
            return "no_result", None, f"result is not plain JSON: {str(exc)[:200]}"


def plain_json(data: bytes) -> Any:
    """JSON read back as data, refused unless it round-trips exactly: no NaN or Infinity (also not
    through an overflowing number like ``1e999``), no repeated keys, no unpaired surrogates."""

    def refuse_constant(name: str) -> Any:
        raise ValueError(f"non-finite number {name}")

    def finite(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"non-finite number {text[:40]}")
        return value

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) != len(pairs):
            raise ValueError("a key repeated in one object")
        return found

    value = json.loads(data, parse_constant=refuse_constant, parse_float=finite, object_pairs_hook=unique)
    try:
        again = json.loads(json.dumps(value, allow_nan=False, ensure_ascii=False).encode())
    except UnicodeEncodeError:
        raise ValueError("a string that is not valid UTF-8 (an unpaired surrogate)") from None
    if again != value:
        raise ValueError("does not round-trip through JSON")
    return value


class Launch:
    """The descriptors an isolated run is started with: bubblewrap reads the seccomp program from
    ``seccomp``, and the IPC cap writes ``ready`` on ``ready_write`` once the run's namespace is capped,
    just before the run's own code starts. Without isolation there are none."""

    def __init__(self, isolated: bool):
        self.isolated = isolated
        self.passed: tuple[int, ...] = ()
        self._ready, self._said_ready = -1, False
        if isolated:
            self.seccomp, write = os.pipe()
            os.write(write, bounds.no_user_namespaces())
            os.close(write)
            self._ready, self.ready_write = os.pipe()
            self.passed = (self.seccomp, self.ready_write)

    def started(self) -> None:
        """The child holds its ends now: close ours, so that reading ``ready`` ends when the run does."""
        for fd in self.passed:
            os.close(fd)
        self.passed = ()

    def ready(self) -> bool:
        """Whether the run's own code started inside a capped namespace (always, without isolation);
        asked again, the same answer once it is yes."""
        if not self.isolated or self._said_ready:
            return True
        os.set_blocking(self._ready, False)  # a process that outlived its run must not hang the harness
        try:
            self._said_ready = os.read(self._ready, 16) == b"ready\n"
        except (BlockingIOError, OSError):
            return False
        return self._said_ready

    def __enter__(self) -> Launch:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in (*self.passed, self._ready):
            if fd >= 0:
                os.close(fd)
        self.passed, self._ready = (), -1


class Cell:
    """What one run (or one workspace, over its runs) holds alone: a uid of the sandbox's range,
    locked across threads and processes, and a folder on a tmpfs of its own, ``sandbox.disk_bytes``
    plus ``extra_bytes`` large with ``sandbox.max_files`` plus ``extra_files`` inodes.

    ``close`` unmounts and removes the folder, and never raises (a failure is logged). A run whose
    processes would not die (its cgroup could not be emptied) marks the cell ``stuck``: its uid then
    stays locked for the life of this process, so no later run shares it. Without every isolation
    layer the cell is a plain temporary folder under the caller's own uid, with neither budget.
    """

    def __init__(self, sandbox: LocalSandbox, extra_bytes: int = 0, extra_files: int = 0):
        self._tmp = Path(tempfile.mkdtemp(prefix=f"{CELL_PREFIX}{os.getpid()}-"))  # whose it is, by pid
        self.folder = self._tmp / "cell"
        self.folder.mkdir()
        self.isolated = sandbox.isolated
        self._lock, self._mounted, self.stuck = None, False, False
        if not self.isolated:
            self.uid = os.getuid()
            return
        try:
            self.uid, self._lock = _lease_uid(sandbox.uids)
            _mount_tmpfs(self.folder, sandbox.disk_bytes + extra_bytes, sandbox.max_files + extra_files, self.uid)
            self._mounted = True
        except BaseException:
            self.close()
            raise

    def exhausted(self) -> str | None:
        """Why the folder is full (no space or no inodes left), or None."""
        if not self._mounted:
            return None
        try:
            stats = os.statvfs(self.folder)
        except OSError:
            return None
        if stats.f_bavail == 0:
            return f"the workdir's {stats.f_blocks * stats.f_frsize >> 20} MiB are used up"
        if stats.f_favail == 0:
            return f"the workdir's {stats.f_files} files are used up"
        return None

    def close(self) -> None:
        try:
            if self._mounted:
                if _libc.umount2(str(self.folder).encode(), MNT_DETACH) != 0:
                    log.warning("could not unmount %s: %s", self.folder, os.strerror(ctypes.get_errno()))
                self._mounted = False
            remove_tree(self._tmp)
            if self._lock is not None:
                if self.stuck:
                    log.error("sandbox uid %d: a run's processes survived SIGKILL; the uid stays locked", self.uid)
                    _STUCK.append(self._lock)
                else:
                    os.close(self._lock)
                self._lock = None
        except Exception:  # cleanup never raises into the caller
            log.exception("sandbox cleanup of %s failed", self._tmp)

    def __enter__(self) -> Cell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_tree(path: Path) -> None:
    """Delete a folder and all it holds, at any depth, following no link, never raising: ``rm -rf``
    walks the tree iteratively (a chain of folders thousands deep, which breaks a recursive walk and
    exceeds PATH_MAX, is removed too). What cannot be removed is logged."""
    try:
        done = subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, stdin=subprocess.DEVNULL
        )
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return
    if done.returncode != 0:
        log.warning("could not remove all of %s: %s", path, done.stderr.decode(errors="replace").strip()[-300:])


_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
_STUCK: list[int] = []  # lock descriptors of uids whose processes did not die: never released
#: tasks a run's cgroup allows beyond ``max_processes``: the launcher, bubblewrap's two, the IPC cap
EXTRA_TASKS = 8
_UID_LOCKS = Path(tempfile.gettempdir()) / "propel-uid-locks"
_lease_guard = threading.Lock()


def _lease_uid(uids: range) -> tuple[int, int]:
    """A uid of ``uids`` that no other run on this machine holds, and the locked descriptor holding it."""
    _UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    start = random.randrange(len(uids))
    with _lease_guard:
        for offset in range(len(uids)):
            uid = uids[(start + offset) % len(uids)]
            fd = os.open(_UID_LOCKS / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
    raise SandboxUnavailable(f"all {len(uids)} sandbox uids from {uids.start} are in use (raise uid_count)")


def _mount_tmpfs(folder: Path, size: int, inodes: int, uid: int) -> None:
    options = f"size={size},nr_inodes={inodes},mode=0755,uid={uid},gid={uid}".encode()
    if _libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        code = ctypes.get_errno()
        raise SandboxUnavailable(f"could not mount a tmpfs for the workdir: {os.strerror(code)}")


OUT_DIR = "/propel-out"  # a writable folder outside the checkout, in every workspace
#: a cell's folder under the temporary directory: this prefix, then the pid of the process that made it
CELL_PREFIX = "propel-sandbox-"


class Workspace:
    """One episode's private copy of a folder (a repository's checkout, an ML task's files), run
    through the local sandbox.

    Each ``run`` is a fresh sandboxed process with the copy writable at ``workdir`` and ``OUT_DIR``
    beside it; nothing else of the host is writable and the network is off. ``read``/``write`` reach
    files by their path inside the sandbox and never follow a symlink out of it. ``close`` (or leaving
    the ``with`` block) deletes the copy; no process outlives its ``run``.
    """

    def __init__(self, sandbox: LocalSandbox, source: Path, workdir: str):
        if not source.is_dir():
            raise PropelError(f"{source} is not a folder to copy into a workspace")
        self.sandbox, self.workdir = sandbox, workdir
        size, files = _footprint(source)
        self._cell = Cell(sandbox, extra_bytes=size, extra_files=files)
        try:
            self.roots = {workdir: self._cell.folder / "repo", OUT_DIR: self._cell.folder / "out"}
            shutil.copytree(source, self.roots[workdir], symlinks=True)
            self.roots[OUT_DIR].mkdir()
            for folder in self.roots.values():
                for parent, dirs, names in os.walk(folder):
                    for name in [parent, *(os.path.join(parent, n) for n in dirs + names)]:
                        os.lchown(name, self._cell.uid, self._cell.uid)
        except BaseException:
            self._cell.close()
            raise

    def run(self, command: str, time_limit: float | None = None) -> SandboxResult:
        """Run ``command`` with an empty ``/tmp`` of its own (inside the workspace's budget), so that
        nothing one run leaves there reaches the next."""
        tmp = self._cell.folder / "tmp"
        remove_tree(tmp)
        tmp.mkdir(mode=0o1777)
        os.chmod(tmp, 0o1777)
        binds = {"/tmp": tmp, **self.roots}
        return self.sandbox.run_command(command, binds, self.workdir, self._cell, time_limit)

    def read(self, path: str, limit: int = 16 << 20) -> bytes:
        fd = _open_regular(self._host(path), os.O_RDONLY, path)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(limit)

    def write(self, path: str, data: bytes) -> None:
        fd = _open_regular(self._host(path), os.O_WRONLY | os.O_CREAT, path)
        os.ftruncate(fd, 0)
        os.fchown(fd, self._cell.uid, self._cell.uid)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)

    def close(self) -> None:
        self._cell.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _host(self, path: str) -> str:
        """The host path of a sandbox path, refused when it (or a folder on the way) leaves its root."""
        inside = path if path.startswith("/") else f"{self.workdir}/{path}"
        for mount, root in self.roots.items():
            if inside == mount or inside.startswith(mount + "/"):
                host = os.path.normpath(os.path.join(root, inside[len(mount) :].lstrip("/")))
                parent = os.path.realpath(os.path.dirname(host))
                if parent == str(root) or parent.startswith(str(root) + os.sep):
                    return host
                raise PropelError(f"{path} leaves the workspace")
        raise PropelError(f"{path} is outside the workspace ({', '.join(self.roots)})")


def _footprint(source: Path) -> tuple[int, int]:
    """Bytes (rounded up to pages) and inodes a copy of ``source`` takes on a tmpfs."""
    size = files = 0
    for parent, dirs, names in os.walk(source):
        files += 1 + len(dirs)
        for name in names:
            files += 1
            with contextlib.suppress(OSError):
                size += -(-os.lstat(os.path.join(parent, name)).st_size // 4096) * 4096
    return size, files


def _open_regular(host: str, flags: int, path: str) -> int:
    """A descriptor of the regular file at ``host``, opened without following a symbolic link and
    without blocking (a FIFO the sandbox left there must not hang the harness), then made blocking."""
    try:
        fd = os.open(host, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PropelError(f"{path} is a symbolic link") from None
        if exc.errno == errno.ENXIO:
            raise PropelError(f"{path} is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PropelError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def _threads_of(pid: int) -> list[int]:
    """The threads of process ``pid`` (without a cgroup, its children are not seen)."""
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _python_in_mount() -> str:
    """The interpreter's path inside the sandbox, where ``sys.base_prefix`` is mounted at PYTHON_MOUNT."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (version, "python3"):
        if (Path(sys.base_prefix) / "bin" / candidate).exists():
            return f"{PYTHON_MOUNT}/bin/{candidate}"
    raise SandboxUnavailable(f"no interpreter under {sys.base_prefix}/bin")
