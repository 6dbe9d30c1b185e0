"""What the kernel bounds for each sandbox run: a memory and process cgroup (which also accounts its
CPU time and gives it a CPU share of its own, where the machine has those controllers), a tiny SysV
IPC allowance, and no new user namespaces.

The cgroup is the bound on everything a run can pin.

Resource limits (``prlimit``) count a process's address space, not what it leaves outside it: SysV
shared memory detached after use, memfd files, tmpfs pages, page tables. A memory cgroup counts all of
those for every process in it, so a run that goes over its bound is killed (status ``oom``) or refused
more memory, and the host's OOM killer never has to choose. The cgroup also gives the sandbox the
run's processes exactly (a process cannot leave a cgroup it does not own), so reaping reads one file
instead of scanning ``/proc``.

Both hierarchies are supported: cgroup v1 (a ``memory`` and a ``pids`` controller, each mounted on its
own; swap counted through ``memory.memsw``) and cgroup v2 (one unified tree with ``memory.max``,
``memory.swap.max`` and ``pids.max``). Run groups are made inside the cgroup this process already
runs in, named ``propel-run-PID-N``; one a dead process left behind is removed by the next process
that makes one there. :func:`missing` says in one line why runs cannot be bounded on this machine.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import struct
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "propel-run-"
_numbers = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    """Where run groups are made: v1 gives a folder per controller, v2 the same folder for all. ``cpu``
    accounts the CPU time of a group's processes, exited ones included (v1's ``cpuacct``, v2's
    ``cpu.stat``, there without any controller); None where v1 has no ``cpuacct`` propel may use."""

    version: int
    memory: Path
    pids: Path
    cpu: Path | None = None
    #: where a run gets a CPU share of its own (v1's ``cpu``, v2's ``cpu`` controller): a run in a
    #: group of its own competes as one, and the kernel's autogroups (which a run could renice) do not
    #: apply to it; None where propel may not use one
    share: Path | None = None


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, file system type, super options) of every cgroup mount."""
    found = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as handle:
        for line in handle:
            before, _, after = line.partition(" - ")
            fields, tail = before.split(), after.split()
            if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per controller (v1) and under the key ``""`` (v2), from /proc/self/cgroup."""
    paths = {}
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _folder(mount_root: str, mount_point: str, path: str) -> Path:
    """The folder of cgroup ``path`` under a mount of the hierarchy whose root is ``mount_root``."""
    relative = os.path.relpath(path, mount_root) if path.startswith(mount_root) else path.lstrip("/")
    return Path(mount_point) / ("" if relative == "." else relative)


@cache
def hierarchy() -> Hierarchy | str:
    """Where this process makes run groups, or one line saying why it cannot."""
    own, mounts = _own_paths(), _mounts()
    v1 = {}
    for root, point, kind, options in mounts:
        for controller in ("memory", "pids", "cpuacct", "cpu"):
            if kind == "cgroup" and controller in options and controller in own:
                v1[controller] = _folder(root, point, own[controller])
    if "memory" in v1:
        if "pids" not in v1:
            return "cgroup v1 has a memory controller but no pids controller mounted"
        if not (v1["memory"] / "memory.memsw.limit_in_bytes").exists() and _swap_on():
            return "swap is on and cgroup v1 does not account it (boot with swapaccount=1, or turn swap off)"
        if not all(os.access(folder, os.W_OK) for folder in v1.values()):
            return f"no write access to {v1['memory']} and {v1['pids']} (run as root or delegate them)"
        usable = {name: folder for name, folder in v1.items() if os.access(folder, os.W_OK)}
        return _remove_orphans(Hierarchy(1, v1["memory"], v1["pids"], usable.get("cpuacct"), usable.get("cpu")))
    for root, point, kind, _ in mounts:
        if kind == "cgroup2" and "" in own:
            folder = _folder(root, point, own[""])
            if {"memory", "pids"} <= (enabled := _enabled(folder)):
                return _remove_orphans(Hierarchy(2, folder, folder, folder, folder if "cpu" in enabled else None))
            return (
                f"cgroup v2: the memory and pids controllers are not delegated to {folder} "
                "(enable them in its cgroup.subtree_control, e.g. systemd-run -p Delegate=yes)"
            )
    return "no cgroup hierarchy with a memory controller is mounted"


def _swap_on() -> bool:
    try:
        return len(Path("/proc/swaps").read_text().splitlines()) > 1
    except OSError:
        return False


def _enabled(folder: Path) -> set[str]:
    """The v2 controllers a child of ``folder`` gets, enabling memory and pids there if they are not yet."""
    control = folder / "cgroup.subtree_control"
    with contextlib.suppress(OSError):
        wanted = {"memory", "pids"} - set(control.read_text().split())
        if wanted:
            control.write_text(" ".join(f"+{name}" for name in sorted(wanted)))
    with contextlib.suppress(OSError):  # a CPU share of its own for each run, where it can be had
        if "cpu" not in control.read_text().split():
            control.write_text("+cpu")
    try:
        return set(control.read_text().split())
    except OSError:
        return set()


def missing() -> str | None:
    """Why sandbox runs cannot get a cgroup here (one line), or None when they can."""
    found = hierarchy()
    return found if isinstance(found, str) else None


class RunGroup:
    """The cgroup of one run: ``memory_bytes`` of memory (swap included, so it counts once) and
    ``processes`` tasks. Put a command in it with :meth:`launcher`; afterwards :meth:`reap` kills
    everything in it and :meth:`close` removes it. ``close`` never raises."""

    def __init__(self, memory_bytes: int, processes: int):
        found = hierarchy()
        if isinstance(found, str):
            raise OSError(found)
        self.hierarchy = found
        name = f"{PREFIX}{os.getpid()}-{next(_numbers)}"
        parents = (found.memory, found.pids, *(folder for folder in (found.cpu, found.share) if folder))
        self.folders = list(dict.fromkeys(parent / name for parent in parents))
        try:
            for folder in self.folders:
                folder.mkdir()
            if found.version == 1:
                (found.memory / name / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):  # no swap accounting: checked there is no swap
                    (found.memory / name / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            else:
                (found.memory / name / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):  # a kernel built without swap
                    (found.memory / name / "memory.swap.max").write_text("0")
            (found.pids / name / "pids.max").write_text(str(processes))
        except BaseException:
            self.close()
            raise

    def launcher(self) -> list[str]:
        """A prefix for a command line: the shell it starts joins the group, then execs the command,
        so the command and all it starts are in the group from their first instruction."""
        joins = " && ".join(f"echo $$ > {folder}/cgroup.procs" for folder in self.folders)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "propel-run"]

    def processes(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.folders[0] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def threads(self) -> list[int]:
        """The ids of every thread in the group now (the kernel's, as ``/proc`` names them)."""
        name = "tasks" if self.hierarchy.version == 1 else "cgroup.threads"
        try:
            return [int(tid) for tid in (self.folders[0] / name).read_text().split()]
        except OSError:
            return []

    def cpu_seconds(self) -> float | None:
        """The CPU time the group's processes have used, exited ones included (None: not accounted)."""
        cpu = self.hierarchy.cpu
        if cpu is None:
            return None
        folder = cpu / self.folders[0].name
        with contextlib.suppress(OSError, ValueError):
            if self.hierarchy.version == 1:
                return int((folder / "cpuacct.usage").read_text()) / 1e9
            for line in (folder / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        return None

    def reap(self, patience: float = 5.0) -> bool:
        """Kill every process in the group until none is left; False if some survive ``patience`` s."""
        deadline = time.monotonic() + patience
        while pids := self.processes():
            if time.monotonic() > deadline:
                log.error("sandbox run group %s: processes %s survive SIGKILL", self.folders[0].name, pids)
                return False
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)
        return True

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for going over its memory bound."""
        if self.hierarchy.version == 1:
            name, file = "oom_kill", "memory.oom_control"
        else:
            name, file = "oom_kill", "memory.events"
        with contextlib.suppress(OSError, ValueError):
            for line in (self.folders[0] / file).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == name:
                    return int(value) > 0
        return False

    def close(self) -> None:
        for folder in self.folders:
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("could not remove the run group %s: %s", folder, exc)


def _remove_orphans(found: Hierarchy) -> Hierarchy:
    """Remove run groups left by processes that are gone (a propel killed with SIGKILL); once a process."""
    for parent in dict.fromkeys((found.memory, found.pids, *(folder for folder in (found.cpu, found.share) if folder))):
        with contextlib.suppress(OSError):
            for folder in parent.iterdir():
                if not folder.name.startswith(PREFIX):
                    continue
                owner = folder.name[len(PREFIX) :].split("-")[0]
                if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                    with contextlib.suppress(OSError):
                        folder.rmdir()
    return found


# -- SysV IPC: a tiny allowance in the run's own IPC namespace --------------------------------------

#: the IPC namespace's limits, set by root inside it before the run drops to its uid: 1 MiB of shared
#: memory in at most 4 segments, 4 message queues of 16 KiB, 4 semaphore sets
IPC_LIMITS = {
    "kernel/shmmax": "1048576",
    "kernel/shmall": "256",
    "kernel/shmmni": "4",
    "kernel/msgmax": "8192",
    "kernel/msgmnb": "16384",
    "kernel/msgmni": "4",
    "kernel/sem": "32 128 32 4",
}


def ipc_cap(ready_fd: int) -> list[str]:
    """A prefix for the command run inside the sandbox's namespaces (still as root): it sets
    ``IPC_LIMITS`` for the run's IPC namespace, writes ``ready`` on ``ready_fd`` and closes it (so the
    run cannot write there), then execs the rest of the command line (without the SHLVL bash would
    add to its environment). No ``ready``: not capped."""
    sets = "".join(f"echo '{value}' > /proc/sys/{name} && " for name, value in IPC_LIMITS.items())
    script = f'{sets}echo ready >&{ready_fd} && exec {ready_fd}>&- && exec /usr/bin/env -u SHLVL "$@"'
    return ["/bin/bash", "-c", script, "propel-ipc"]


# -- no user namespaces: a seccomp filter --------------------------------------------------------------

CLONE_NEWUSER = 0x10000000
#: audit arch -> (clone, unshare, clone3) syscall numbers
SYSCALLS = {0xC000003E: (56, 272, 435), 0xC00000B7: (220, 97, 435)}  # x86-64, aarch64
ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000  # x86-64's x32 ABI numbers syscalls from here: refused whole
ALLOW, ERRNO = 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
LOAD, JEQ, JSET, JGE, RET = 0x20, 0x15, 0x45, 0x35, 0x06


def no_user_namespaces() -> bytes | None:
    """A classic BPF seccomp program (bubblewrap's ``--seccomp``) that refuses to make a user
    namespace: ``clone`` and ``unshare`` with CLONE_NEWUSER fail with EPERM, ``clone3`` (whose flags a
    filter cannot read) with ENOSYS, so the C library falls back to ``clone``; another ABI than the
    machine's own is refused whole. None on an architecture it has no syscall numbers for."""
    arch = ARCHES.get(os.uname().machine)
    if arch is None:
        return None
    clone, unshare, clone3 = SYSCALLS[arch]
    program = [
        (LOAD, 0, 0, 4),  # 0: the ABI
        (JEQ, 1, 0, arch),  # 1: the machine's own -> 3
        (RET, 0, 0, ERRNO | ENOSYS),  # 2: another ABI
        (LOAD, 0, 0, 0),  # 3: the syscall number
        (JGE, 8, 0, X32_BIT),  # 4: x32 -> 13
        (JEQ, 7, 0, clone3),  # 5: -> 13
        (JEQ, 2, 0, clone),  # 6: -> 9
        (JEQ, 1, 0, unshare),  # 7: -> 9
        (RET, 0, 0, ALLOW),  # 8: any other call
        (LOAD, 0, 0, 16),  # 9: the flags (the low half of the first argument)
        (JSET, 0, 1, CLONE_NEWUSER),  # 10: a new user namespace -> 11, else 12
        (RET, 0, 0, ERRNO | EPERM),  # 11
        (RET, 0, 0, ALLOW),  # 12
        (RET, 0, 0, ERRNO | ENOSYS),  # 13: clone3, x32
    ]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in program)
