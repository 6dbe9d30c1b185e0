"""The ``docker`` sandbox: one fresh container per episode, from the repository's image.

Each workspace is a new container with the network off, every capability dropped, no new
privileges, the engine's default seccomp profile (no new user namespaces), a private IPC namespace
with a bounded ``/dev/shm``, and CPU, memory, process and (where the engine's storage driver
supports it) disk limits; it is removed when the workspace closes, whatever happened. The memory
limit is the container's cgroup, swap included: it counts anonymous memory, tmpfs and ``/dev/shm``,
SysV segments and memfd files alike, and a command the kernel kills for going over it ends ``oom``.
Commands run with ``docker exec`` under ``timeout`` inside the container; a command that outlives
its limit anyway gets the whole container killed (never a host PID). ``DOCKER_HOST`` may point at
a remote engine; the engine socket is never mounted into a container.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shlex
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath

from propel_core import PropelError
from propel_plugins.sandbox import OUT_DIR, SandboxResult, SandboxUnavailable

log = logging.getLogger(__name__)
LABEL = "propel.workspace"
SHM_BYTES = 64 << 20  # /dev/shm, inside the memory limit like everything else
KILLED = 128 + 9  # the exit status of a command that ended by SIGKILL, as the OOM killer ends one
#: where a container's own cgroup counts the kills at its memory limit (cgroup v2, then v1)
OOM_COUNT = "cat /sys/fs/cgroup/memory.events 2>/dev/null || cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"


class DockerSandbox:
    def __init__(
        self,
        cpus: float = 2.0,
        memory_gb: float = 4.0,
        disk_gb: float | None = 10.0,
        pids: int = 512,
        time_limit: float = 120.0,
        max_output_bytes: int = 1 << 20,
        base_image: str | None = None,
        hide: list[str] | None = None,
    ):
        self.cpus, self.memory_gb, self.disk_gb, self.pids = cpus, memory_gb, disk_gb, pids
        self.hide = [str(path) for path in hide or ()]
        if bad := [path for path in self.hide if not PurePosixPath(path).is_absolute()]:
            raise PropelError(f"the docker sandbox's hide option names paths in the image, absolute, not {bad[:5]}")
        self.time_limit, self.max_output_bytes, self.base_image = time_limit, max_output_bytes, base_image
        try:
            import docker

            self.client = docker.from_env(timeout=300)
            self.client.ping()
            engine_cpus = float(self.client.info().get("NCPU") or cpus)
        except Exception as exc:  # docker raises several unrelated types when there is no engine
            raise SandboxUnavailable(f"no Docker engine reachable (DOCKER_HOST or the default socket): {exc}") from None
        if engine_cpus < cpus:  # the engine refuses a container that asks for more
            log.warning("docker sandbox: cpus %g is more than the engine's %g CPUs; using those", cpus, engine_cpus)
            self.cpus = engine_cpus

    def workspace(self, path: Path | None = None, image: str | None = None, workdir: str = "/testbed"):
        """A fresh container from ``image``; or from ``base_image`` with the checkout at ``path`` copied in."""
        if image is None and (path is None or self.base_image is None):
            raise PropelError("the docker sandbox needs a repository image, or a path and the base_image option")
        return DockerWorkspace(self, image or self.base_image, workdir, path if image is None else None)

    def host_config(self) -> dict:
        limits = dict(
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            nano_cpus=int(self.cpus * 1e9),
            mem_limit=f"{int(self.memory_gb * 1024)}m",
            memswap_limit=f"{int(self.memory_gb * 1024)}m",
            ipc_mode="private",
            shm_size=SHM_BYTES,
            pids_limit=self.pids,
        )
        if self.disk_gb is not None:
            limits["storage_opt"] = {"size": f"{int(self.disk_gb)}G"}
        return limits


class DockerWorkspace:
    def __init__(self, sandbox: DockerSandbox, image: str, workdir: str, source: Path | None):
        import docker

        self.sandbox, self.workdir = sandbox, workdir
        self.alive, self.oom_kills = True, 0
        try:
            self.container = sandbox.client.containers.create(
                image, command=["sleep", "infinity"], working_dir="/", labels={LABEL: "1"}, **sandbox.host_config()
            )
        except docker.errors.APIError as exc:
            if "storage-opt" in str(exc) or "storage_opt" in str(exc) or "quota" in str(exc):
                raise SandboxUnavailable(
                    f"the Docker engine cannot limit disk size ({exc.explanation}); set disk_gb: null in the "
                    "sandbox options to run without a disk limit"
                ) from None
            raise PropelError(f"cannot create a container from {image!r}: {exc.explanation}") from None
        try:
            if source is not None:
                self.container.put_archive(str(PurePosixPath(workdir).parent), _tar_folder(source, workdir))
            self.container.start()
            self.run(f"mkdir -p {OUT_DIR}")
            if sandbox.hide:  # the container's own copy of them: gone before any command of the caller runs
                paths = " ".join(shlex.quote(path) for path in sandbox.hide)
                removed = self.run(f'rm -rf -- {paths}; for p in {paths}; do test ! -e "$p" || exit 1; done')
                if not removed.ok:
                    raise SandboxUnavailable(f"could not delete the hidden paths: {removed.stderr[-300:]}")
        except Exception:
            self.close()
            raise

    def run(self, command: str, time_limit: float | None = None) -> SandboxResult:
        limit = time_limit or self.sandbox.time_limit
        if not self.alive:
            return SandboxResult("sandbox_error", detail="the container was killed")
        api = self.sandbox.client.api
        started = time.monotonic()
        exec_id = api.exec_create(
            self.container.id, ["timeout", "-k", "2", str(int(limit) + 1), "bash", "-c", command], workdir=self.workdir
        )["Id"]
        chunks: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        capped = threading.Event()

        def collect():
            for out, err in api.exec_start(exec_id, stream=True, demux=True):
                for name, data in (("stdout", out), ("stderr", err)):
                    if data and not capped.is_set():
                        chunks[name] += data
                if sum(map(len, chunks.values())) > self.sandbox.max_output_bytes:
                    capped.set()

        reader = threading.Thread(target=collect, daemon=True)
        reader.start()
        reader.join(limit + 10)
        duration = time.monotonic() - started
        out, err = (bytes(chunks[k]).decode(errors="replace") for k in ("stdout", "stderr"))
        if reader.is_alive():  # timeout inside the container did not end it: kill the container
            self.kill()
            return SandboxResult("timeout", stdout=out, stderr=err, duration=duration, detail="container killed")
        code = api.exec_inspect(exec_id)["ExitCode"]
        self._reap()
        # the code's own exit status is its choice (``exit 124`` is no timeout): only what the harness
        # saw itself counts, the deadline passed, the output cap, a kill the container's cgroup counted
        if code != 0 and duration >= limit:
            status = "timeout"
        elif capped.is_set():
            status = "output_limit"
        elif code == KILLED and self._killed_for_memory():
            status = "oom"
        else:
            status = "ok" if code == 0 else "error"
        return SandboxResult(status, returncode=code, stdout=out, stderr=err, duration=duration)

    def _killed_for_memory(self) -> bool:
        """Whether the kernel killed a process at the memory limit since the last time we asked."""
        api = self.sandbox.client.api
        try:
            text = api.exec_start(api.exec_create(self.container.id, ["sh", "-c", OOM_COUNT])["Id"]).decode()
        except Exception:  # a container killed meanwhile counts nothing more
            return False
        kills = [int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")]
        if not kills or kills[0] <= self.oom_kills:
            return False
        self.oom_kills = kills[0]
        return True

    def _reap(self) -> None:
        """Kill every process a command left behind (all but the container's init), as the local
        sandbox does after each run: nothing outlives its ``run`` to change files while they are read."""
        api = self.sandbox.client.api
        with contextlib.suppress(Exception):  # a container killed meanwhile has nothing left
            api.exec_start(api.exec_create(self.container.id, ["bash", "-c", "kill -KILL -1"])["Id"])

    def read(self, path: str, limit: int = 16 << 20) -> bytes:
        import docker

        inside = path if path.startswith("/") else f"{self.workdir}/{path}"
        try:
            stream, stat = self.container.get_archive(inside)
        except docker.errors.NotFound:
            raise FileNotFoundError(inside) from None
        if stat.get("mode", 0) & (1 << 31):  # a folder: never fetched whole
            stream.close()
            raise PropelError(f"{path} is not a regular file")
        data = bytearray()
        for chunk in stream:  # at most the limit and a header's worth, whatever the file's size
            data += chunk
            if len(data) > limit + (1 << 20):
                break
        stream.close()
        with tarfile.open(fileobj=io.BytesIO(bytes(data[: limit + (1 << 20)]))) as tar:
            member = tar.next()
            if member is None or not member.isreg():
                raise PropelError(f"{path} is not a regular file")
            return tar.extractfile(member).read(limit)

    def write(self, path: str, data: bytes) -> None:
        inside = PurePosixPath(path if path.startswith("/") else f"{self.workdir}/{path}")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(inside.name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        self.container.put_archive(str(inside.parent), buffer.getvalue())

    def kill(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):  # already stopped
            self.container.kill()

    def close(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):  # already gone
            self.container.remove(force=True)

    def __enter__(self) -> DockerWorkspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tar_folder(source: Path, workdir: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(source), arcname=PurePosixPath(workdir).name)
    return buffer.getvalue()
