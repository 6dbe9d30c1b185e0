"""A base image for the docker sandbox, built from this machine's own files, for engines that
cannot pull from a registry: bash, git, the core utilities, libfaketime, the Python interpreter
(standard library only) and one virtual environment with a repository's test dependencies, with the shared
libraries they and every compiled extension in them load. Imported into the engine with ``docker
import``; the docker sandbox copies a checkout into each container (its ``base_image`` option).
"""

from __future__ import annotations

import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from propel_core import PropelError

TOOLS = (
    "bash",
    "sh",
    "git",
    "timeout",
    "env",
    "cat",
    "ls",
    "cp",
    "mv",
    "rm",
    "mkdir",
    "rmdir",
    "touch",
    "chmod",
    "sed",
    "grep",
    "head",
    "tail",
    "wc",
    "sort",
    "uniq",
    "find",
    "xargs",
    "diff",
    "sleep",
    "echo",
    "pwd",
    "dirname",
    "basename",
    "tr",
    "cut",
    "true",
    "false",
    "test",
    "nl",
    "id",
    "mktemp",
)
SKIPPED = re.compile(r"/(site-packages|test|tests|idlelib|tkinter|turtledemo|ensurepip|__pycache__)(/|$)")


def shared_libraries(binaries: list[str]) -> set[str]:
    """Every shared library (and the loader) the binaries load, by ``ldd``."""
    found: set[str] = set()
    for binary in binaries:
        listed = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
        found |= {match for match in re.findall(r"(/\S+\.so[\.\d]*)", listed) if os.path.exists(match)}
    return found


def rootfs(python_env: Path) -> bytes:
    """The root filesystem as an uncompressed tar."""
    binaries = [path for tool in TOOLS if (path := shutil.which(tool, path="/usr/bin:/bin"))]
    interpreter = os.path.realpath(python_env / "bin" / "python")
    base = Path(interpreter).parent.parent
    binaries.append(interpreter)
    binaries += glob.glob("/usr/lib/*/faketime/libfaketime.so.1")  # the second runner's shifted clock
    # compiled extensions load system libraries too (ctypes: libffi; numpy: libstdc++, ...)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in (python_env, base / "lib" / version / "lib-dynload"):
        binaries += [str(path) for path in folder.rglob("*.so*") if path.is_file() and ".so" in path.suffixes]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for folder in ("tmp", "testbed", "etc", "root"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
        # one entry per file, under its folder's real path (/lib may be a link to /usr/lib), named
        # as it is loaded (libc.so.6, not the file it links to)
        files = {
            os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p)): os.path.realpath(p)
            for p in {*binaries, *shared_libraries(binaries)}
        }
        for name, real in sorted(files.items()):
            if not name.startswith((f"{base}/", f"{python_env}/")):  # those folders come whole, below
                tar.add(real, arcname=name.lstrip("/"))
        for top in ("/bin", "/lib", "/lib64", "/sbin"):
            if os.path.islink(top):
                info = tarfile.TarInfo(top.lstrip("/"))
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(top)
                tar.addfile(info)
        for extra in ("/usr/lib/git-core", "/usr/share/git-core"):
            if os.path.isdir(extra):
                tar.add(extra, arcname=extra.lstrip("/"))
        tar.add(str(base / "bin"), arcname=str(base / "bin").lstrip("/"))
        lib = base / "lib"
        for entry in lib.iterdir():
            if entry.name.startswith("libpython"):
                tar.add(str(entry), arcname=str(entry).lstrip("/"))
        stdlib = lib / version
        tar.add(
            str(stdlib),
            arcname=str(stdlib).lstrip("/"),
            filter=lambda info: None if SKIPPED.search("/" + info.name) else info,
        )
        tar.add(str(python_env), arcname=str(python_env).lstrip("/"), filter=_no_caches)
    return buffer.getvalue()


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name else info


def import_image(client, tag: str, python_env: Path) -> str:
    """Build the root filesystem and ``docker import`` it as ``tag``; returns the image id."""
    if not (python_env / "bin" / "python").exists():
        raise PropelError(f"{python_env} is not a virtual environment")
    repository, _, version = tag.partition(":")
    changes = [f"ENV PATH={python_env}/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8", "ENV PYTHONDONTWRITEBYTECODE=1"]
    client.api.import_image_from_data(
        rootfs(python_env), repository=repository, tag=version or "latest", changes=changes
    )
    return client.images.get(tag).id
