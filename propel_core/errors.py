"""The exception types the CLI turns into a clean message instead of a traceback."""


class PropelError(Exception):
    """A problem the user can fix: bad config, unknown component, missing file."""


class NotEnoughData(PropelError):
    """A stage cannot go on with what the earlier stages produced (no positive labels, say): a finding
    about the run, not a bad input. ``propel demo`` reports it and stops the pipeline there."""


class RewardError(PropelError):
    """A reward rule got scores it cannot turn into a reward (missing or non-finite)."""
