"""The second runner: one test, in a fresh process, judged without pytest's reporting where it can.

It runs inside the sandbox as ``python RUNNER ORDERS`` in the repository's own test environment
(the sandbox's, with the variables its test command and registry entry set, ``PYTHONPATH`` with
``src`` for a src layout) and nothing else (no variable names propel or pytest's plugins), from a
folder and file whose names are drawn per run. It reads its orders (the tests' node ids, the descriptor to
answer on, the run's nonce, the guard's module and the lines the change wrote) from ORDERS and
deletes the file before any code of the repository is imported. At that moment it also takes every
function it calls after the test (``os.write``, unittest's runners), keeps the nonce and the
descriptor in its own frame only, puts an empty module in place of ``__main__`` (so nothing of it
can be looked up by name), snapshots the machinery it will call (``guard.watch``), installs the
guard (``guard.install``: no frames, ``gc``, ``ctypes`` or processes for the change's code) and
makes what the code under test reads of its process a plain pytest run's (``guard.as_a_user``: its
folder off ``sys.path``, libfaketime's variables out of ``os.environ``, ``sys.argv`` and
``sys.orig_argv`` those of ``python -m pytest`` with the test command's arguments).

A plain test (a function, or a method of a plain class or a ``unittest.TestCase``, taking no
fixtures, in a file that uses no fixtures, marks or parametrization, with no ``conftest.py`` on its
path) is called directly with its xunit set-up and tear-down, as pytest calls them, so pytest's
runner and its hooks take no part. Any other test runs under ``pytest.main`` with a recorder object
passed in as a plugin: no module name, no ``PYTEST_PLUGINS``. It takes a list of tests and writes
one line, ``NONCE OUTCOME ...`` (one word a test, in order), on the descriptor, a pipe to the
harness that differs from the first runner's in number, key and format. Outcomes: ``passed``,
``failed`` (the test raised), ``skipped``, ``error`` (its set-up failed or it could not be run),
``refused`` (in place of passed or failed, once the guard has refused the change anything),
``tampered`` (the machinery that judges a test was changed while it ran). A test the orders give a
time limit (``time_limits``) fails when it runs past it in its call, and is an error when it does so
in its import, a set-up or a tear-down, as under the first runner (a test called directly has the
limit once for all of these; under pytest, each phase has it): the watcher beside the process keeps
it (``guard.time_limit``) and interrupts the process past it.
"""

# a private copy of the builtins, taken before any code of the repository runs: every function this
# module defines looks names up there, so code under test that replaces a builtin changes nothing here
__builtins__ = dict(vars(__import__("builtins")))

import contextlib
import importlib
import json
import os
import sys
import types
import unittest
import warnings
from pathlib import Path

WRITE = os.write
SUITE, RESULT = unittest.TestSuite, unittest.TestResult
SUITE_RUN, CASE = unittest.TestSuite.run, unittest.TestCase
NEEDS_PYTEST = ("fixture", "pytestmark", "parametrize", "usefixtures", "pytest.mark")
MODULE_HOOKS = (("setup_module", "setUpModule"), ("teardown_module", "tearDownModule"))


WATCHED = ("unittest", "_pytest", "pytest", "pluggy", "builtins")
#: the warning pytest gives for the environment's plugins, which this runner imports before ``pytest.main``
#: (``_import_environment_plugins``) and pytest's start does not: ignored, as a filter on pytest's command
#: line (applied after the repository's ``filterwarnings``), so ``filterwarnings = error`` does not make
#: it an internal error of every test run under pytest here while plain pytest runs them
PLUGINS_IMPORTED_FIRST = "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"
CHANGE = types.SimpleNamespace(asks=lambda: False)  # whether code the change wrote is on the stack (guard)
#: each test's time limit (node id -> seconds), and the context that keeps it (``guard.time_limit``)
TIME = types.SimpleNamespace(limits={}, within=None, out=())


def main() -> None:
    write, join = WRITE, str.join
    orders_path = Path(sys.argv[1])
    orders = json.loads(orders_path.read_text())
    orders_path.unlink()
    root, tests, nonce, fd = Path(orders["root"]), orders["tests"], orders["nonce"], orders["fd"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.path.insert(0, str(root))  # as ``python -m pytest`` run from the checkout has it
    intact = refusals = None
    try:
        if any(_needs_pytest(root, test) for test in tests):
            import pytest  # noqa: F401  (before the repository's code, so the snapshot holds it)

            _import_environment_plugins()
        guard = importlib.import_module(orders["guard"])
        intact = guard.watch(WATCHED)
        TIME.limits, TIME.out = orders.get("time_limits") or {}, guard.OutOfTime
        TIME.within = guard.time_limit(fd, nonce)
        refusals, CHANGE.asks = guard.install(str(root), orders.get("written") or {})
        here = os.path.dirname(os.path.realpath(__file__))
        guard.as_a_user(here, None, orders.get("faked") or (), ["-m", "pytest", *(orders.get("argv") or ())])
        del guard
        with warnings.catch_warnings(record=True):  # recorded, as pytest does: never shown with a source line
            outcomes = run(root, tests)
    except BaseException:  # the runner could not load or find a test, or a test left the process
        outcomes = ["error"] * len(tests)
    if refusals is not None and refusals():  # the change asked the guard for something
        outcomes = ["refused" if outcome in ("passed", "failed") else outcome for outcome in outcomes]
    if intact is not None and set(intact()) - set(orders.get("machinery") or ()):  # the change replaced what judges
        outcomes = ["tampered"] * len(tests)
    data = (nonce + " " + join(" ", outcomes) + "\n").encode()
    while data:
        data = data[write(fd, data) :]


def _import_environment_plugins() -> None:
    """Import the test environment's pytest plugins (entry points of group ``pytest11``, unless the
    environment turns their loading off) before the snapshot, as pytest's start imports them before
    the first runner's report plugin takes its own: what they change in pytest as they load
    (hypothesis's plugin wraps the fixture marker) is then the environment's under both runners, not
    the change's. A plugin that fails to import is left to pytest, which will say so. Pytest warns
    that it cannot rewrite the asserts of a plugin imported before it starts; that warning alone is
    ignored (``PLUGINS_IMPORTED_FIRST``)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return
    from importlib.metadata import entry_points

    for entry in entry_points(group="pytest11"):
        with contextlib.suppress(Exception):
            importlib.import_module(entry.module)


def run(root: Path, tests: list[str]) -> list[str]:
    """Each test's outcome, in order: the plain ones called directly, the others in one pytest session."""
    outcomes = {test: run_alone(root, test) for test in tests if not _needs_pytest(root, test)}
    _leave_scopes()
    others = [test for test in tests if test not in outcomes]
    if others:
        outcomes.update(run_under_pytest(root, others))
    return [outcomes.get(test, "error") for test in tests]


def _needs_pytest(root: Path, test: str) -> bool:
    path, _, names = test.partition("::")
    file = root / path
    return "[" in names or _has_conftest(root, file.parent) or any(word in file.read_text() for word in NEEDS_PYTEST)


def run_alone(root: Path, test: str) -> str:
    """``run_directly`` under the test's time limit: past it, the call fails (``_call``), and an
    import or a set-up or tear-down of a module or class is an error, as under pytest."""
    try:
        with TIME.within(TIME.limits.get(test)):
            return run_directly(root, test)
    except TIME.out:
        return "error"


def run_directly(root: Path, test: str) -> str:
    path, _, names = test.partition("::")
    module = _import(root / path)
    owner, function = None, module
    for name in names.split("::"):
        owner, function = function, getattr(function, name)
    if owner is module:
        owner = None
    if isinstance(owner, type) and issubclass(owner, CASE):
        result = RESULT()
        # by the name the test is reached by, not its function's own: a generated test (a metaclass
        # or a loop that sets lambdas) has a function named ``<lambda>``
        try:
            SUITE_RUN(SUITE([owner(name)]), result)  # class and module fixtures included
        except KeyboardInterrupt as interrupt:  # the time limit: unittest lets it through
            return "failed" if _in_the_test(interrupt) else "error"
        if result.errors or result.failures or result.unexpectedSuccesses:
            return "failed"
        return "skipped" if result.skipped else "passed"
    if _takes_fixtures(function, owner):
        return run_under_pytest(root, [test])[test]
    instance = owner() if owner is not None else None
    call = getattr(instance, name) if instance is not None else function
    return _call(module, instance, call)


def _call(module, instance, call) -> str:
    """Run a plain test between its xunit set-up and tear-down, as pytest does: the module's and the
    class's once per process (``SCOPES``, torn down at the end), the method's or function's around
    the call, each given its argument only where it takes one."""
    (setup, setup_alias), (teardown, teardown_alias) = MODULE_HOOKS
    if not _enter(module, _hook(module, setup, setup_alias), _hook(module, teardown, teardown_alias), module):
        return "error"
    if instance is not None:
        owner = type(instance)
        if not _enter(owner, _hook(owner, "setup_class"), _hook(owner, "teardown_class"), owner):
            return "error"
        set_up, tear_down = _hook(instance, "setup_method"), _hook(instance, "teardown_method")
    else:
        set_up, tear_down = _hook(module, "setup_function"), _hook(module, "teardown_function")
    try:
        if set_up is not None:
            _optional_argument(set_up, call)
    except Exception:
        return "error"  # the set-up failed: the test never ran
    try:
        call()
        outcome = "passed"
    except KeyboardInterrupt:  # the test's time limit (run_alone) ran out in its call: it failed
        outcome = "failed"
    except Exception as exc:
        outcome = "skipped" if type(exc).__name__ == "SkipTest" else "failed"
    except BaseException as exc:  # pytest's outcomes (``pytest.raises``' "DID NOT RAISE", ``pytest.fail``,
        # ``pytest.skip``, ``pytest.xfail``) are no Exception; and pytest calls a test's SystemExit a failure
        names = {kind.__name__ for kind in type(exc).__mro__}
        if "OutcomeException" not in names and not isinstance(exc, SystemExit):
            raise
        outcome = "skipped" if names & {"Skipped", "XFailed"} else "failed"
    if tear_down is not None:
        try:
            _optional_argument(tear_down, call)
        except Exception:
            outcome = "error"
    return outcome


SCOPES: dict[int, bool] = {}  # id of a module or class -> whether its set-up succeeded
TEARDOWNS: list = []  # (tear-down, argument) of each scope set up, in order


def _enter(holder, set_up, tear_down, argument) -> bool:
    if id(holder) not in SCOPES:
        try:
            if set_up is not None:
                _optional_argument(set_up, argument)
            SCOPES[id(holder)] = True
            TEARDOWNS.append((tear_down, argument))
        except Exception:
            SCOPES[id(holder)] = False
        except KeyboardInterrupt:  # a set-up past the test's time limit failed for every test of its scope
            SCOPES[id(holder)] = False
            raise
    return SCOPES[id(holder)]


def _leave_scopes() -> None:
    for tear_down, argument in reversed(TEARDOWNS):
        if tear_down is not None:  # a failure here pytest reports on the last test; the outcomes are in
            with contextlib.suppress(Exception):
                _optional_argument(tear_down, argument)


def _hook(holder, *names):
    for name in names:
        found = getattr(holder, name, None)
        if callable(found):
            return found
    return None


def _in_the_test(interrupt: KeyboardInterrupt) -> bool:
    """Whether an interrupt reached a unittest test in its test method (else in a set-up)."""
    tb = interrupt.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "_callTestMethod":
        tb = tb.tb_next
    return tb is not None


def _optional_argument(function, argument) -> None:
    code = getattr(function, "__code__", None)
    count = code.co_argcount - (1 if hasattr(function, "__self__") else 0) if code is not None else 0
    function(argument) if count > 0 else function()


def _takes_fixtures(function, owner) -> bool:
    code = getattr(function, "__code__", None)
    if code is None:
        return True
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return len(names) > (1 if owner is not None else 0)


def _has_conftest(root: Path, folder: Path) -> bool:
    while True:
        if (folder / "conftest.py").exists():
            return True
        if folder == root or root not in folder.parents:
            return False
        folder = folder.parent


def _import(file: Path):
    """Import a test file as pytest's default import mode does: its first folder upwards that is not
    a package goes first on the path, and the module is named from there."""
    base, parts = file.parent, [file.stem]
    while (base / "__init__.py").exists():
        parts.insert(0, base.name)
        base = base.parent
    sys.path.insert(0, str(base))
    return importlib.import_module(".".join(parts))


def run_under_pytest(root: Path, tests: list[str]) -> dict[str, str]:
    import pytest

    class Recorder:
        def __init__(self):
            self.outcomes, self.phases, self.plugin_of_the_change = {}, {}, False

        def pytest_plugin_registered(self, plugin):
            self.plugin_of_the_change = self.plugin_of_the_change or (plugin is not self and CHANGE.asks())

        def limited(self, item):  # each phase under the test's time limit, as under the first runner
            with TIME.within(TIME.limits.get(item.nodeid)):
                return (yield)

        pytest_runtest_setup = pytest_runtest_call = pytest_runtest_teardown = pytest.hookimpl(wrapper=True)(limited)

        def pytest_runtest_logreport(self, report):
            phases = self.phases.setdefault(report.nodeid, {})
            phases[report.when] = report.outcome
            if report.when == "teardown":
                if "failed" in (phases.get("setup"), phases.get("teardown")):
                    outcome = "error"
                elif phases.get("call") == "failed":
                    outcome = "failed"
                elif "skipped" in (phases.get("setup"), phases.get("call")):
                    outcome = "skipped"
                else:
                    outcome = "passed" if phases.get("call") == "passed" else "error"
                self.outcomes[report.nodeid] = outcome

    recorder = Recorder()
    os.chdir(root)
    pytest.main([*tests, "-q", "-p", "no:cacheprovider", "-W", PLUGINS_IMPORTED_FIRST], plugins=[recorder])
    if recorder.plugin_of_the_change:  # pytest's config reached (sys.meta_path holds it) and used
        return dict.fromkeys(tests, "tampered")
    return {test: recorder.outcomes.get(test, "error") for test in tests}


if __name__ == "__main__":
    main()
