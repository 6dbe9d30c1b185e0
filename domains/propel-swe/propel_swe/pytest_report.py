"""The pytest plugin propel puts into every run of a repository's suite (through ``PYTEST_PLUGINS``).

It runs inside the sandbox, in the same process as the code under test, so it imports nothing but
the standard library and the guard beside it. pytest imports it, under a module name drawn per run,
while it reads its options, before capturing output and before any code of the repository is
imported; at that moment it reads its orders from ``orders.json`` beside it (the run's key, the
checkout's root, the tests to select, the guard's module name), deletes the file, installs the guard
(``guard``: what the code under test may not do), and duplicates descriptor 3, a pipe straight to
the harness. Once pytest has registered it, it takes itself out of ``sys.modules``, so the code under
test cannot look it up by name or by its attributes. Then it writes, on that descriptor, one line
per event:

    PROPEL-REPORT <key> {"event": "start"}
    PROPEL-REPORT <key> {"event": "test", "id": "<pytest node id>", "outcome": "passed", "seconds": 0.01}
    PROPEL-REPORT <key> {"event": "end", "exitstatus": 1, "imported": ["pkg/core.py", ...]}

Before each line it checks that pytest, pluggy, unittest, json and the builtins still hold the
functions and classes they held when it was imported (``guard.watch``), other than those the clean
suite changes itself, and that no plugin was registered while the change's code ran; if not, it writes one
``{"event": "tampered"}`` line and nothing more. A test's line is written once, when its last phase
is reported: ``error`` (collection, set-up or tear-down failed), ``failed`` (the test itself
failed), ``skipped`` (skipped or an expected failure) or ``passed``; ``refused`` in place of the
last two once the guard has refused the change anything (it ran otherwise than it would outside).
``imported`` lists the files under the checkout that were imported by the end of the session. A pipe
cannot be rewritten: what the code under test writes after the end line, or a second line for a
test, is seen by the harness as tampering. When the orders select tests (node ids), every other test
is deselected. A test the orders give a time limit (``time_limits``: node id -> seconds, or
``time_limit`` for every test) has each of its phases stopped there from outside the process
(``guard.time_limit``: the watcher reads ``PROPEL-CLOCK`` lines on the same descriptor and
interrupts the process): a call that runs past it fails, a set-up or tear-down is an error;
``seconds`` is how long its three phases took. Once registered, it also takes what propel added out
of what the code under test reads of its run (``guard.as_a_user``): its module's name from
``PYTEST_PLUGINS``, its folder from ``PYTHONPATH`` and ``sys.path``. The orders of the preflight's
second run (``trace_lines``) also have it trace the run (``sys.settrace``, in every thread): the end
line then holds ``lines_run``, the lines of each non-test file under the checkout that ran (path ->
line numbers), what the procedural generator plants bugs on. No other run is traced.
"""

# a private copy of the builtins, taken before any code of the repository runs: every function this
# module defines looks names up there, so code under test that replaces a builtin changes nothing here
__builtins__ = dict(vars(__import__("builtins")))

import importlib
import json
import os
import sys
import threading
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
#: the modules whose functions and classes pytest calls on its way from a test to this plugin's lines
WATCHED = ("_pytest", "pytest", "pluggy", "unittest", "json", "builtins")
#: what the clean suite itself changes of them (pytest's legacypath plugin, a repository's conftest)
ALLOWED = frozenset(ORDERS.get("machinery") or ())
TAMPERED = '{"event": "tampered"}'  # written as it is: json's encoder may be what was changed
KEY, ROOT = ORDERS.get("key", ""), Path(ORDERS.get("root") or os.getcwd())
SELECT = None if ORDERS.get("select") is None else set(ORDERS["select"])
LIMITS = ORDERS.get("time_limits") or {}  # node id -> seconds each of its phases may run
LIMIT = ORDERS.get("time_limit")  # ... for a test not named there (the preflight's: its whole budget)
_intact = _refusals = _asks = _within = _is_test = None
_plugin_of_the_change = False  # a pytest plugin registered while the change's code ran
try:
    OUT = os.dup(3)
except OSError:
    OUT = None
if ORDERS.get("guard"):
    _guard = importlib.import_module(ORDERS["guard"])
    _intact = _guard.watch(WATCHED)
    _refusals, _asks = _guard.install(str(ROOT), ORDERS.get("written") or {})
    _within = _guard.time_limit(OUT, KEY) if OUT is not None else None
    _guard.as_a_user(os.path.dirname(__file__), __name__)
    _is_test = _guard.is_test_path
    del _guard


def _line_tracer(is_test):
    """(a trace function, the lines it saw run: checkout-relative path -> line numbers). A frame whose
    module is outside the checkout, or is a test file (``is_test``), is not traced (its trace
    function is None), so pytest, the libraries and the tests run at nearly full speed; one of the
    code under test has a local trace function that adds each line of its code's file it runs. The
    module is told by its globals' ``__file__``: reading a frame's code raises an audit event, which
    the guard's hook answers, so the code is read only for frames of the code under test."""
    lines_run, inside, local_tracers = {}, {}, {}

    def checkout_path(filename):
        if not isinstance(filename, str) or filename.startswith("<"):  # frozen, compiled from a string
            return None
        try:
            return Path(filename).resolve().relative_to(ROOT).as_posix()
        except (ValueError, OSError):
            return None

    def local_tracer(filename):
        relative = checkout_path(filename)
        if relative is None:
            return None
        seen = lines_run.setdefault(relative, set())

        def local(frame, event, arg):
            if event == "line":
                seen.add(frame.f_lineno)
            return local

        return local

    def trace(frame, event, arg):
        module = frame.f_globals.get("__file__")
        if type(module) is not str:
            return None
        if module not in inside:
            relative = checkout_path(module)
            inside[module] = relative is not None and not is_test(relative)
        if not inside[module]:
            return None
        filename = frame.f_code.co_filename
        if filename not in local_tracers:
            local_tracers[filename] = local_tracer(filename)
        return local_tracers[filename]

    return trace, lines_run


_lines_run = None
if ORDERS.get("trace_lines") and _is_test is not None:
    _trace, _lines_run = _line_tracer(_is_test)
    threading.settrace(_trace)
    sys.settrace(_trace)
    del _trace

_phases, _seconds = {}, {}
_active = True
# taken now, before any code of the repository is imported: code under test that replaces json.dumps
# or os.write (allowed modules) later changes nothing this plugin writes
_dumps, _write = json.dumps, os.write


def _emit(event):
    global _active
    if OUT is None or not _active:
        return
    if _plugin_of_the_change or (ORDERS.get("written") and _intact is not None and set(_intact()) - ALLOWED):
        _active = False
        event_text = TAMPERED
    else:
        event_text = _dumps(event)
    data = f"PROPEL-REPORT {KEY} {event_text}\n".encode()
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


def pytest_plugin_registered(plugin):
    global _plugin_of_the_change
    if plugin is sys.modules.get(__name__):
        del sys.modules[__name__]
    elif _asks is not None and _asks():  # pytest's config reached (sys.meta_path holds it) and used
        _plugin_of_the_change = True


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


def _limited(item):
    """Each phase of a test (set-up, call, tear-down) under the test's time limit: past it the phase
    raises ``guard.OutOfTime``, and the test fails (an error, in set-up or tear-down)."""
    if _within is None:
        return (yield)
    with _within(LIMITS.get(item.nodeid, LIMIT)):
        return (yield)


pytest_runtest_setup = pytest_runtest_call = pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(_limited)


def pytest_runtest_logreport(report):
    _phases.setdefault(report.nodeid, {})[report.when] = report.outcome
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":  # always the last phase, whatever happened before it
        outcome = _outcome(_phases.pop(report.nodeid))
        if _refusals is not None and _refusals() and outcome in ("passed", "failed"):
            outcome = "refused"  # the change asked the guard for something: not what it does outside
        seconds = round(_seconds.pop(report.nodeid), 4)
        _emit({"event": "test", "id": report.nodeid, "outcome": outcome, "seconds": seconds})


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
    machinery = sorted(_intact()) if _intact is not None else []
    refused = sorted(set(_refusals()))[:5] if _refusals is not None else []  # what the guard said no to
    end = {"event": "end", "exitstatus": int(exitstatus), "imported": sorted(imported), "machinery": machinery,
           "refused": refused}  # fmt: skip
    if _lines_run is not None:
        sys.settrace(None)
        end["lines_run"] = {path: sorted(lines) for path, lines in _lines_run.items()}
    _emit(end)
