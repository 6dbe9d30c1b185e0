"""Local checkouts and test environments for the ``local`` sandbox, built from what PyPI serves.

A repository for the local sandbox is a git checkout on disk plus a virtual environment holding its
test dependencies (the sandbox's ``python_env``). ``sdist_checkout`` turns a project's source
distribution into such a checkout; ``python_environment`` makes the environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import subprocess
import sys
import tarfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from propel_core import PropelError

GIT_IDENTITY = ["-c", "user.name=propel", "-c", "user.email=propel@localhost"]


def git_checkout(folder: Path) -> Path:
    """Make ``folder`` a git repository with everything in it committed."""
    for command in (["init", "-q"], ["add", "-A"], [*GIT_IDENTITY, "commit", "-qm", "initial", "--no-verify"]):
        done = subprocess.run(["git", "-C", str(folder), *command], capture_output=True, text=True)
        if done.returncode != 0:
            raise PropelError(f"git {command[-1]} failed in {folder}: {done.stderr.strip()}")
    return folder


def sdist_checkout(requirement: str, downloads: Path, into: Path) -> Path:
    """Download ``requirement``'s source distribution (once, into ``downloads``), unpack it under
    ``into`` and commit it: a clean checkout of the released source with its own tests.
    ``requirement`` names the project as a user writes it (``More-Itertools==10.5.0``,
    ``more_itertools``); the archive is found by the normalized name (``sdist_archives``)."""
    downloads.mkdir(parents=True, exist_ok=True)
    try:
        wanted = Requirement(requirement)
    except InvalidRequirement as exc:
        raise PropelError(f"{requirement!r} is not a requirement (name==version): {exc}") from None
    # the project itself from source; its build backend may come as a wheel (uv_build's own sdist builds
    # maturin from Rust crates: with --no-binary :all: no project built by uv_build could be fetched)
    only_source = ["--no-binary", canonicalize_name(wanted.name)]
    command = [sys.executable, "-m", "pip", "download", "-q", *only_source, "--no-deps", "-d", str(downloads)]
    if not sdist_archives(downloads, wanted):
        with exclusive(downloads / ".lock"):  # another process may be fetching it: wait, then look again
            if not sdist_archives(downloads, wanted):
                done = subprocess.run([*command, requirement], capture_output=True, text=True)
                if done.returncode != 0:
                    raise PropelError(f"cannot download the sdist of {requirement}: {done.stderr.strip()[-300:]}")
    archives = sdist_archives(downloads, wanted)
    if not archives:
        raise PropelError(f"{requirement} has no .tar.gz source distribution")
    with tarfile.open(archives[-1]) as archive:
        top = archive.getnames()[0].split("/")[0]
        archive.extractall(into, filter="data")
    return git_checkout(into / top)


def sdist_archives(downloads: Path, wanted: Requirement) -> list[Path]:
    """The ``.tar.gz`` source distributions in ``downloads`` of the project ``wanted`` names, at a
    version it allows, oldest first. An archive is ``{name}-{version}.tar.gz`` where the name is the
    project's under any spelling PEP 503 counts as the same (PEP 625's ``more_itertools``, the older
    ``more-itertools``, ``Django``)."""
    project, found = canonicalize_name(wanted.name), []
    for archive in downloads.glob("*.tar.gz"):
        name, _, version = archive.name.removesuffix(".tar.gz").rpartition("-")
        try:
            parsed = Version(version)
        except InvalidVersion:
            continue
        if name and canonicalize_name(name) == project and wanted.specifier.contains(parsed, prereleases=True):
            found.append((parsed, archive))
    return [archive for _, archive in sorted(found)]


@contextlib.contextmanager
def exclusive(lock: Path):
    """Hold ``lock`` (a file, made if missing) against every other process that asks for it: two
    processes that build the same cached folder take turns, and the second finds it built."""
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def python_environment(folder: Path, packages: list[str]) -> Path:
    """A virtual environment at ``folder`` with ``packages`` installed (kept once it is complete; one
    process builds it while any other that asks waits)."""
    ready = folder / ".propel-ready"
    wanted = "\n".join(packages)

    def built() -> bool:
        try:
            return ready.read_text() == wanted
        except OSError:  # not there, or removed by a rebuild under way
            return False

    if built():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(folder.with_name(f"{folder.name}.lock")):
        if built():  # built while this one waited
            return folder
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
        done = subprocess.run(
            [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *packages],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise PropelError(f"cannot install {' '.join(packages)} into {folder}: {done.stderr.strip()[-300:]}")
        ready.write_text(wanted)
    return folder


def environment_identity(folder: Path) -> str:
    """What names the Python environment at ``folder`` for the preflight cache: its resolved path,
    its ``pyvenv.cfg`` (the interpreter it was made from) and everything installed in its
    site-packages (each distribution's ``.dist-info`` names its version), hashed. Installing,
    upgrading or removing a package, or rebuilding the environment on another interpreter, changes it."""
    folder = folder.expanduser().resolve()
    digest = hashlib.sha256(str(folder).encode())
    with contextlib.suppress(OSError):
        digest.update((folder / "pyvenv.cfg").read_bytes())
    for site in sorted(folder.glob("lib*/python*/site-packages")):
        digest.update(f"\0{site.relative_to(folder)}".encode())
        for entry in sorted(entry.name for entry in site.iterdir() if entry.name != "__pycache__"):
            digest.update(f"\0{entry}".encode())
    return f"{folder}#{digest.hexdigest()[:16]}"
