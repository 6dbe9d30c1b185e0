"""Helpers shared by the swe tests: a real bug in the tiny repository, scripted agents, registries."""

from pathlib import Path

import yaml

BUG = """\
--- a/tinystats/core.py
+++ b/tinystats/core.py
@@ -16,7 +16,7 @@
 def clamp(value, low, high):
     if value < low:
         return low
-    if value > high:
+    if value > low:
         return high
     return value
"""


def reverted(bug: str) -> str:
    """The diff that undoes ``bug``: a real fix."""
    fix = bug.replace("a/", "x/").replace("b/", "a/").replace("x/", "b/")
    fix = fix.replace("-    if value > high:", "=").replace("+    if value > low:", "-    if value > low:")
    return fix.replace("=", "+    if value > high:")


def scripted(*replies):
    """A Reply that answers the turns in order and records what it was shown."""
    seen = []

    def reply(messages):
        seen.append([dict(m) for m in messages])
        return replies[len(seen) - 1]

    reply.seen = seen
    return reply


def fenced(tool, body=""):
    return f"Next step.\n```{tool}\n{body}\n```"


def write_registry(folder: Path, repos: list[dict], splits: dict | None = None) -> Path:
    path = folder / "repos.yaml"
    path.write_text(yaml.safe_dump({"repos": repos, "splits": splits or {}}))
    return path
