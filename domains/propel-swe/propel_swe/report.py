"""The harness's side of a suite run: reading the plugin's lines back (``pytest_report``) and
snapshots of the checkout taken by a process that runs none of the repository's code.

Every verdict reads test outcomes from the plugin's pipe, never from files the code under test can
write, and compares snapshots to see what a diff changed and what a run of the suite changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MARK = "PROPEL-REPORT"
OUTCOMES = ("passed", "failed", "error", "skipped", "refused")  # refused: the guard denied the change something
PLUGIN = (Path(__file__).parent / "pytest_report.py").read_bytes()

#: Run as ``python -I -S``: the standard library only, no site, no environment, the checkout not on
#: the path. Writes {path: "MODE SHA1" | "dir MODE" | "link TARGET" | "special" | "unreadable"} for
#: everything but ``.git``; what it cannot list or read is there as "unreadable", never skipped.
SNAPSHOT = r"""
import hashlib, json, os, stat, sys
found = {}
pending = ["."]
while pending:  # by hand, not os.walk: a tree of any depth is listed, never a RecursionError
    parent = pending.pop()
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        found[os.path.relpath(parent)] = "unreadable"
        continue
    for name in names:
        if parent == "." and name == ".git":
            continue
        path = os.path.join(parent, name)[2:]
        try:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[path] = "link " + os.readlink(path)
            elif stat.S_ISDIR(info.st_mode):
                found[path] = "dir %o" % stat.S_IMODE(info.st_mode)
                pending.append("./" + path)
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha1()
                with open(path, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                found[path] = "%o %s" % (stat.S_IMODE(info.st_mode), digest.hexdigest())
            else:
                found[path] = "special"
        except OSError:
            found[path] = "unreadable"
with open(sys.argv[1], "w") as out:
    json.dump(found, out)
"""


@dataclass
class Report:
    tests: dict[str, str] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)  # seconds each test's phases took
    imported: list[str] = field(default_factory=list)
    machinery: list[str] = field(default_factory=list)  # runner functions and classes the run changed
    refused: list[str] = field(default_factory=list)  # what the guard refused the change
    lines_run: dict[str, list[int]] | None = None  # path -> lines that ran, where the run was traced
    problem: str | None = None


def read_report(stdout: str, key: str) -> Report:
    """The outcomes the plugin reported under ``key``; ``problem`` says why they cannot be trusted:
    no plugin lines, a line under another key or unreadable, a test reported twice, anything before
    the start or after the end, or no end (the run died or was cut short)."""
    report, events = Report(), []
    for number, line in enumerate(stdout.splitlines()):
        if not line.startswith(MARK):
            continue
        parts = line.split(" ", 2)
        if len(parts) != 3 or parts[1] != key:
            return Report(problem=f"report line {number + 1} is not under this run's key: forged")
        try:
            event = json.loads(parts[2])
        except (ValueError, RecursionError):  # nested past what the parser walks: still not an event
            return Report(problem=f"report line {number + 1} is not JSON: forged")
        if not isinstance(event, dict):
            return Report(problem=f"report line {number + 1} is not an event: forged")
        events.append(event)
    if not events:
        return Report(problem="the suite ran without the report plugin (is the test command pytest?)")
    kinds = [event.get("event") for event in events]
    if "tampered" in kinds:
        return Report(problem="the code under test changed the functions or classes that report outcomes: tampered")
    if kinds[0] != "start" or kinds.count("start") != 1:
        return Report(problem="the report does not open with exactly one start: forged")
    if "end" not in kinds:
        return Report(problem="the report has no end: the run died or was cut short")
    if kinds.count("end") != 1 or kinds[-1] != "end":
        return Report(problem="report lines after the end: forged")
    for event in events[1:-1]:
        test, outcome = event.get("id"), event.get("outcome")
        if event.get("event") != "test" or not isinstance(test, str) or outcome not in OUTCOMES:
            return Report(problem=f"an unknown report event {str(event)[:100]}: forged")
        if test in report.tests:
            return Report(problem=f"{test} reported twice: forged")
        report.tests[test] = outcome
        seconds = event.get("seconds")
        if type(seconds) in (int, float) and 0 <= seconds < 1e9:
            report.durations[test] = float(seconds)
    imported = events[-1].get("imported")
    report.imported = [path for path in imported if isinstance(path, str)] if isinstance(imported, list) else []
    refused = events[-1].get("refused")
    report.refused = [what for what in refused if isinstance(what, str)] if isinstance(refused, list) else []
    lines_run = events[-1].get("lines_run")
    if isinstance(lines_run, dict):
        report.lines_run = {
            path: [line for line in lines if type(line) is int]
            for path, lines in lines_run.items()
            if isinstance(lines, list)
        }
    machinery = events[-1].get("machinery")
    report.machinery = [name for name in machinery if isinstance(name, str)] if isinstance(machinery, list) else []
    return report
