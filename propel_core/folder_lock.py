"""One command at a time in a run folder: the lock a command holds on ``RUN/.propel.lock`` while it
works there, and the line that refuses a second one.

Two commands writing one run folder at once mix their records (two trainings in one reward log) and
their settings (``settings.json`` claimed by each in turn), so every command that starts a run holds
its folder (:func:`propel_core.run.start_run`, before it writes anything or loads a model): an
exclusive ``flock`` on the lock file, in which the holder writes who it is (pid, host, command line,
since when) for the refusal to name. The kernel lets go of the lock when the process that holds it
ends, however it ends (Ctrl-C, SIGKILL, a lost node), so a folder is never left held by a process
that died: the next command takes it over and writes itself in. A process holds a folder once,
whatever number of runs it starts there, until it ends or calls :func:`release` (the CLI does at the
end of each command).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from typing import IO

from propel_core.errors import PropelError

#: the lock file in a run folder
LOCK = ".propel.lock"

#: the folders this process holds (resolved path -> the open lock file, whose closing lets go)
_held: dict[Path, IO[str]] = {}


def hold(run_dir: Path) -> None:
    """Take ``run_dir`` for this process (made if missing), or refuse in one line naming the command
    that holds it; a folder this process holds already is held."""
    folder = Path(run_dir).resolve()
    if folder in _held:
        return
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK).open("a+")  # not truncated before it is ours: the holder's line stays
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        said = handle.read()
        handle.close()
        raise PropelError(
            f"{run_dir} is in use by another command ({holder_of(said)}): one command at a time works in a "
            "run folder; wait for it to end or stop it, or use another run_dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps(this_holder()) + "\n")
    handle.flush()
    _held[folder] = handle


def release(run_dir: Path) -> None:
    """Let go of ``run_dir`` if this process holds it. The lock file stays, emptied: a command that
    ended names no holder, so two runs of one seed leave the same files (one killed leaves its line,
    which names no holder once its lock is gone)."""
    handle = _held.pop(Path(run_dir).resolve(), None)
    if handle is not None:
        handle.seek(0)
        handle.truncate()
        handle.close()


def this_holder() -> dict[str, object]:
    """Who holds a folder, as the lock file records it: pid, host, command line and since when (UTC)."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def holder_of(said: str) -> str:
    """The holder a lock file's text names, as the refusal says it; a holder that has not written
    itself in yet (it took the lock a moment ago) is named as such."""
    try:
        found = json.loads(said)
        return f"pid {found['pid']} on {found['host']}, `{found['command']}` since {found['since']}"
    except (ValueError, KeyError, TypeError):
        return "it took the folder a moment ago and has not said which yet"
