"""The one exception type the CLI turns into a clean message instead of a traceback."""


class PropelError(Exception):
    """A problem the user can fix: bad config, unknown component, missing file."""
