"""The exception types the CLI turns into a clean message instead of a traceback."""

import errno


class PropelError(Exception):
    """A problem the user can fix: bad config, unknown component, missing file."""


class NotEnoughData(PropelError):
    """A stage cannot go on with what the earlier stages produced (no positive labels, say): a finding
    about the run, not a bad input. ``propel demo`` reports it and stops the pipeline there."""


class RewardError(PropelError):
    """A reward rule got scores it cannot turn into a reward (missing or non-finite)."""


# what a user can do when a run file cannot be written, by errno
_FILE_ADVICE = {
    errno.ENOSPC: "no space left on the device: free some space or set run_dir to another disk, then rerun the "
    "command to go on (finished records are kept)",
    errno.EDQUOT: "disk quota exceeded: free some space or set run_dir to another disk, then rerun the command "
    "to go on (finished records are kept)",
    errno.EROFS: "read-only file system: set run_dir to a writable folder",
    errno.EACCES: "permission denied: set run_dir to a folder you can write to, or fix the permissions",
}
FILE_ERRNOS = frozenset(_FILE_ADVICE)


def file_error(path: object, exc: OSError) -> PropelError:
    """The one-line error for an OSError on ``path`` (a full disk, a read-only mount, no permission)."""
    return PropelError(f"{path}: {_FILE_ADVICE.get(exc.errno, exc.strerror or str(exc))}")


class Unavailable(PropelError):
    """Something the run needs cannot work on this machine (a sandbox layer, say): it stops the stage
    and is never held against the task that happened to meet it first."""
