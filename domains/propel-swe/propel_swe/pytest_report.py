"""The pytest plugin propel puts into every run of a repository's suite (through ``PYTEST_PLUGINS``).

It runs inside the sandbox, in the same process as the code under test, so it imports nothing but
the standard library. pytest imports it while it reads its options, before capturing output and
before any code of the repository is imported; at that moment it reads its orders from
``orders.json`` beside it (the run's key, the checkout's root, the tests to select), deletes the
file, and duplicates descriptor 3, a pipe straight to the harness. Then it writes, on that
descriptor, one line per event:

    PROPEL-REPORT <key> {"event": "start"}
    PROPEL-REPORT <key> {"event": "test", "id": "<pytest node id>", "outcome": "passed"}
    PROPEL-REPORT <key> {"event": "end", "exitstatus": 1, "imported": ["pkg/core.py", ...]}

A test's line is written once, when its last phase is reported: ``error`` (collection, set-up or
tear-down failed), ``failed`` (the test itself failed), ``skipped`` (skipped or an expected
failure) or ``passed``. ``imported`` lists the files under the checkout that were imported by the
end of the session. A pipe cannot be rewritten: what the code under test writes after the end
line, or a second line for a test, is seen by the harness as tampering. When the orders select
tests (node ids), every other test is deselected.
"""

import json
import os
import sys
from pathlib import Path

import pytest


def _orders():
    path = Path(__file__).resolve().parent / "orders.json"
    try:
        orders = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return {}
    return orders


ORDERS = _orders()
KEY, ROOT = ORDERS.get("key", ""), Path(ORDERS.get("root") or os.getcwd())
SELECT = None if ORDERS.get("select") is None else set(ORDERS["select"])
try:
    OUT = os.dup(3)
except OSError:
    OUT = None

_phases = {}
_active = True
# taken now, before any code of the repository is imported: code under test that replaces json.dumps
# or os.write (allowed modules) later changes nothing this plugin writes
_dumps, _write = json.dumps, os.write


def _emit(event):
    if OUT is None or not _active:
        return
    data = f"PROPEL-REPORT {KEY} {_dumps(event)}\n".encode()
    while data:
        data = data[_write(OUT, data) :]


def _outcome(phases):
    if "failed" in (phases.get("collect"), phases.get("setup")):
        return "error"
    if phases.get("call") == "failed":
        return "failed"
    if phases.get("teardown") == "failed":
        return "error"
    if "skipped" in (phases.get("setup"), phases.get("call")):
        return "skipped"
    return "passed" if phases.get("call") == "passed" else "error"


def pytest_configure(config):
    global _active
    _active = not hasattr(config, "workerinput")  # pytest-xdist workers: their controller reports


def pytest_sessionstart(session):
    _emit({"event": "start"})


def pytest_collectreport(report):
    if report.failed:
        _emit({"event": "test", "id": report.nodeid, "outcome": "error"})


def pytest_collection_modifyitems(session, config, items):
    if SELECT is None:
        return
    kept = [item for item in items if item.nodeid in SELECT]
    dropped = [item for item in items if item.nodeid not in SELECT]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_runtest_logreport(report):
    _phases.setdefault(report.nodeid, {})[report.when] = report.outcome
    if report.when == "teardown":  # always the last phase, whatever happened before it
        _emit({"event": "test", "id": report.nodeid, "outcome": _outcome(_phases.pop(report.nodeid))})


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    imported = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        try:
            relative = Path(path).resolve().relative_to(ROOT)
        except ValueError:
            continue
        imported.add(relative.as_posix())
    _emit({"event": "end", "exitstatus": int(exitstatus), "imported": sorted(imported)})
