"""The guard: what the code a change wrote may not do, denied at run time by the interpreter itself.

Both test runners install it (``install``) as an audit hook (PEP 578) before any code of the
repository is imported; a hook cannot be removed once added. The runner tells it which lines of the
checkout the change (a bug, or a bug and a fix) added or rewrote. Whenever the interpreter is about to
do something sensitive, the hook looks at the call stack, and if a frame runs a function or class
body that holds such a line, or a module's top level at such a line (the line it runs now, so the
module's own imports are not the change's because it rewrote another of its lines), the operation
raises ``Refused`` instead. The repository's own code, its tests, pytest, unittest and the
standard library keep every capability they had: the guard judges who is asking, not what is asked,
so a change that never asks passes unchanged whatever it looks like, and a repository whose own code
takes frames (six's ``exec_``) runs as it always did. Denied to the change's code:

- frames and tracebacks' frames (``sys._getframe``, ``sys._current_frames``, ``tb_frame``,
  ``gi_frame``/``cr_frame``/``ag_frame``), tracing and profiling (``sys.settrace``/``setprofile``),
  another audit hook, and signal handlers (a handler is handed the running frame; ``signal.signal``
  raises no audit event, so the guard puts it behind a check of its own);
- the garbage collector's object lists (``gc.get_objects``/``get_referrers``/``get_referents``),
  ``ctypes`` and other raw-memory modules it imports itself, making, loading or swapping code
  objects itself, and reading the code of the tests itself;
- setting the class of a module or object, or the bases of a class, that the repository did not
  define (setting any other attribute of a class raises no audit event: the runners check what they
  call instead, ``watch``);
- new processes and signals to processes (``subprocess``, ``os.system``, ``os.fork``, ``os.kill``,
  ``_posixsubprocess.fork_exec``), and a second copy of a builtin or extension module (which would
  come without the guard's wrappers);
- opening anything under ``/proc`` or ``/sys`` (its own memory, the runner's environment, the boot
  time past a moved clock) or ``/dev/mem``, and
  opening the repository's test files (reading the assertions it must satisfy, or writing new ones),
  by their names or by any other (a hard link made to one, one moved: ``the_tests``).

A thread started while the change's code is on the stack is the change's too, and so is one the
guard did not see start: everything it asks for is refused, whatever code it runs (the standard
library alone could fetch a frame for it). The standard library's own reads of a frame that hand back
only names and text (logging's caller, a formatted traceback) are let through (``PROBES``,
``READERS``).

Beside the guard, what every runner shares in the process: the in-process half of a test's time
limit (``time_limit``; the watcher, outside, keeps it) and the undoing of what propel put in the
process's view of its run (``as_a_user``), so that a judged process reads as a plain run does.
This file is copied beside each runner inside the sandbox, so it imports nothing but the standard
library; the harness imports it for ``is_test_path`` and ``written_lines``.
"""

# a private copy of the builtins, taken before any code of the repository runs: every function this
# module defines looks names up there, so code under test that replaces a builtin changes nothing here
__builtins__ = dict(vars(__import__("builtins")))

import _signal
import os
import sys
import types

#: the audit event through which what the guard hands out asks its hook to act (``through_the_hook``)
EVENT = "propel.guard"

TEST_DIRS = frozenset({"test", "tests", "testing"})
RUNNER_FILES = frozenset(
    {
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        "sitecustomize.py",
        "usercustomize.py",
        ".coveragerc",
        "pytest.py",
        "pytest.toml",
        ".pytest.toml",
    }
)
#: audit events denied outright to the code under test
EVENTS = frozenset(
    {"sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
     "sys.addaudithook", "sys.monitoring.register_callback", "gc.get_objects", "gc.get_referrers",
     "gc.get_referents", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
     "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn"}
)  # fmt: skip
EVENT_PREFIXES = ("ctypes.", "_xxsubinterpreters.", "_interpreters.")
#: attributes whose reading raises an audit event and hands over a frame or a frame's code
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code"})
#: modules the change's code may not import itself (the standard library may, for its own use)
MODULES = frozenset(
    {"ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi", "_testbuffer",
     "_xxsubinterpreters", "_interpreters", "_posixsubprocess"}
)  # fmt: skip
#: functions of the standard library that ask for the running frame only to read a name from it
PROBES = frozenset(
    {("logging/__init__.py", "findCaller"), ("collections/__init__.py", "namedtuple"), ("typing.py", "_caller"),
     ("enum.py", "_create_")}
)  # fmt: skip
#: ... and those that read a frame's code or a traceback's frames only to write text (logging's
#: caller, a formatted traceback: ``traceback.format_exc``, ``logging.exception``)
READERS = PROBES | {("traceback.py", "_extract_from_extended_frame_gen")}
DEVICES = ("/proc/", "/sys/", "/dev/mem", "/dev/kmem", "/dev/port", "/dev/fd/")


def isolated(function):
    """``function`` remade with globals and builtins of its own (empty): a function the guard hands
    out leads, through ``__globals__`` or ``__builtins__``, to nothing of the guard's (its private
    builtins, which the hook's own functions look names up in, would otherwise be in reach)."""
    return types.FunctionType(
        function.__code__, {"__builtins__": {}}, function.__name__, function.__defaults__, function.__closure__
    )


def through_the_hook(operation: str):
    """A function that asks the guard's hook to do ``operation`` (through ``sys.audit``) and returns
    what the hook did. What the guard puts in place of an original (``signal.signal``, a thread's
    start, ...) and what it hands the runners are such functions: they hold ``sys.audit`` and the
    operation's name, nothing else (``isolated``). The originals and the guard's state live in the
    hook's closure alone, which nothing in the process can reach (the interpreter keeps audit hooks
    where Python code cannot list them). The hook answers only a frame that runs this function's
    code: anyone else's ``sys.audit`` of ``EVENT`` is let pass, as in a plain process."""
    audit, event = sys.audit, EVENT  # bound in the closure: an isolated function has no globals to read

    def guarded(*args, **kwargs):
        box: list = []
        audit(event, operation, args, kwargs, box)
        return box[0]

    return isolated(guarded)


class OutOfTime(Exception):
    """What a runner makes of the interrupt the watcher sends once a phase of a test has run past its
    time limit (``time_limit``): the test failed (an error, in a set-up or tear-down)."""


def time_limit(fd: int, mark: str):
    """``within(seconds)``: a context in which the process's CPU time is limited from outside it. It
    tells the watcher (``watcher.py``, a process beside this one, reading descriptor ``fd``) on a line
    under ``mark`` (the run's key or nonce) this process's id and the seconds as the phase starts, and
    0 as it ends; past the limit the watcher sends SIGINT, which every Python process answers with the
    same handler it starts with (a ``KeyboardInterrupt`` at the next bytecode). The runner makes that
    ``OutOfTime`` on its way out of the context. Nothing of the limit is in the process: no timer, no
    handler of propel's, nothing ``signal.getitimer`` or ``signal.getsignal`` would read otherwise
    than in a user's run (docs/swe.md, "Judged as used"). ``seconds`` None: no limit."""
    import contextlib

    write, pid, out = os.write, os.getpid(), OutOfTime

    def tell(seconds) -> None:
        data = f"PROPEL-CLOCK {mark} {pid} {seconds}\n".encode()
        while data:
            data = data[write(fd, data) :]

    @contextlib.contextmanager
    def within(seconds):
        if type(seconds) not in (int, float) or not 0 < seconds < 1e6:
            yield
            return
        tell(float(seconds))
        try:
            yield
        except KeyboardInterrupt:
            raise out("the test ran past its time limit") from None
        finally:
            tell(0)

    return within


class Refused(PermissionError, ValueError):
    """What the guard raises: an OSError for code that opens files, a ValueError where the standard
    library expects one from ``sys._getframe`` (``logging``, ``collections.namedtuple`` go on without
    the frame)."""


def is_test_path(path: str) -> bool:
    """Tests, and the files that configure how tests run or how Python starts (checkout-relative).
    Plain string work only: the guard calls it while code under test may have replaced attributes
    of the standard library's modules."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    name = parts[-1] if parts else ""
    return (
        any(part in TEST_DIRS for part in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name in RUNNER_FILES
        or name.endswith(".pth")
    )


def written_lines(before: str, after: str) -> list[int]:
    """The line numbers (from 1) of ``after`` that a change from ``before`` added or rewrote."""
    import difflib

    matcher = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    return [line + 1 for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal" for line in range(j1, j2)]


def the_tests(prefix: str) -> frozenset[tuple[int, int]]:
    """The identity (device, inode) of every test file under the checkout folder ``prefix`` (absolute,
    ending in ``/``), its git history left out: a hard link's second name, or a test file moved,
    opens one of these. Taken as the guard installs, before any code of the repository runs."""
    found = set()
    for folder, folders, files in os.walk(prefix):
        folders[:] = [name for name in folders if name != ".git"]
        relative = folder[len(prefix) :]
        for name in files:
            if is_test_path(f"{relative}/{name}"):
                try:
                    identity = os.lstat(f"{folder}/{name}")  # a link in the tests is not followed
                except OSError:
                    continue
                if (identity.st_mode & 0o170000) == 0o100000:
                    found.add((identity.st_dev, identity.st_ino))
    return frozenset(found)


def install(root: str, written: dict[str, list[int]]):
    """Add the audit hook for the checkout at ``root`` and the change's ``written`` lines
    (checkout-relative path -> line numbers), and put what raises no audit event (setting a signal
    handler, starting a thread or a process through ``_posixsubprocess``, making a builtin module
    afresh) behind the same check. Returns (what it has refused so far, whether code the
    change wrote is on the caller's stack now): a runner reports a test ``refused`` rather than
    passed or failed once it has refused anything (the change behaved otherwise than it would
    outside the harness). Everything the hook needs is bound here, in its closure: it reads no
    module attribute that the code under test could replace, and it calls no method of an object
    the code under test made. What replaces an original, and the functions returned, are
    ``through_the_hook`` functions: none of them holds an original or any of the guard's state.
    A test's time limit is no part of it: the watcher keeps it from outside the process
    (``time_limit``)."""
    import _imp
    import _thread
    import pathlib
    import signal
    import subprocess  # noqa: F401  (loads _posixsubprocess now, so its fork_exec is wrapped below)
    import threading

    getframe, thread_id, fspath, lstat, readlink = sys._getframe, _thread.get_ident, os.fspath, os.lstat, os.readlink
    stat = os.stat
    modules, start, owner = sys.modules, os.getcwd(), _thread.get_ident()
    function, module_type, code_type, paths = types.FunctionType, types.ModuleType, types.CodeType, (str, bytes)
    path_classes = (pathlib.PosixPath, pathlib.PurePosixPath)
    is_test, events, event_prefixes, frame_attributes = is_test_path, EVENTS, EVENT_PREFIXES, FRAME_ATTRIBUTES
    denied_modules, devices, refused, name_probes, frame_readers = MODULES, DEVICES, Refused, PROBES, READERS
    asked, answering = EVENT, through_the_hook("asks").__code__  # the code every through_the_hook function runs
    judged = events | {"compile", "marshal.loads", "code.__new__", "import", "open", "object.__getattr__",
                       "object.__setattr__", "object.__delattr__"}  # fmt: skip
    prefix = "/" + "/".join(part for part in root.split("/") if part) + "/"
    lines = {path: frozenset(numbers) for path, numbers in written.items() if numbers}
    busy: set[int] = set()
    tainted: set[int] = set()  # threads the change's code started
    by_change: dict = {}  # code object -> whether it holds a line the change wrote
    compiled: set[str] = set()  # file names of code the change's code compiled (exec, eval, compile)
    refusals: list[str] = []  # what was refused, in order
    library = os.path.dirname(os.__file__) + "/"
    tests = the_tests(prefix)  # (device, inode) of each test file: what opening it by another name opens

    def absolute(path: str, resolve: bool = False) -> str:
        """``path`` made absolute and normal, its symbolic links followed where ``resolve``: builtins
        and string methods only (``os.path`` reads module attributes the code under test can replace)."""
        pending = (path if path.startswith("/") else start + "/" + path).split("/")
        done: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                done = done[:-1]
                continue
            done.append(part)
            if resolve and hops < 40:
                try:
                    link = (lstat("/" + "/".join(done)).st_mode & 0o170000) == 0o120000
                    target = readlink("/" + "/".join(done)) if link else None
                except OSError:
                    target = None
                if target is not None:
                    hops += 1
                    done = [] if target.startswith("/") else done[:-1]
                    pending = target.split("/") + pending
        return "/" + "/".join(done)

    def checkout_path(filename: str) -> str | None:
        path = absolute(filename)
        return path[len(prefix) :] if path.startswith(prefix) else None

    def repository_code(filename) -> bool:
        relative = checkout_path(filename) if type(filename) is str else None
        return relative is not None and not is_test(relative)

    def changed(code) -> bool:
        if code.co_filename in compiled:
            return True
        found = by_change.get(code)
        if found is None:
            relative = checkout_path(code.co_filename)
            mine = lines.get(relative) if relative is not None else None
            found = by_change[code] = bool(mine) and any(line in mine for _, _, line in code.co_lines())
        return found

    def running_changed(frame) -> bool:
        """Whether ``frame`` runs code the change wrote. A module's top level is judged by the line it
        runs now, not as a whole: a change that rewrites one of its lines does not make the module's
        own imports (``ctypes``, say) the change's; a function or class body holding a written line
        is the change's wherever it runs."""
        code = frame.f_code
        if code.co_name != "<module>" or code.co_filename in compiled:
            return changed(code)
        relative = checkout_path(code.co_filename)
        mine = lines.get(relative) if relative is not None else None
        return bool(mine) and frame.f_lineno in mine

    def code_under_test_asks() -> bool:
        """Whether a frame running code the change wrote is on this thread's stack; or this thread
        is the change's (it started it), or was started where the guard could not see (its first
        frame is not the guard's: a thread the standard library alone runs could fetch anything)."""
        if not lines:
            return False
        me = thread_id()
        if me in tainted:
            return True
        frame, first = getframe(1), None
        while frame is not None:
            if running_changed(frame):
                return True
            frame, first = frame.f_back, frame
        return me != owner and (first is None or first.f_code is not started)

    def protected_file(path) -> bool:
        if type(path) is int:
            return False
        if type(path) not in paths:
            if type(path) not in path_classes:
                return True  # a path object of the caller's own making: not read here
            path = fspath(path)
        resolved = absolute(path.decode(errors="replace") if type(path) is bytes else path, resolve=True)
        relative = checkout_path(resolved)
        if resolved.startswith(devices) or resolved in ("/proc", "/sys", "/dev/fd"):
            return True
        if relative is not None and is_test(relative):
            return True
        try:  # a test file by a second name: a hard link made to it, or the file moved
            found = stat(resolved)
        except (OSError, ValueError):
            return False
        return (found.st_dev, found.st_ino) in tests

    def foreign(target) -> bool:
        """Whether no file of the repository's code defined ``target`` (a module, a class, or an
        object's class), read without calling anything the object or its class defines."""
        if type(target) is module_type:
            return not repository_code(target.__dict__.get("__file__"))
        cls = target if isinstance(target, type) else type(target)
        name = type.__dict__["__module__"].__get__(cls, type)
        module = modules.get(name) if type(name) is str else None
        return not (type(module) is module_type and repository_code(module.__dict__.get("__file__")))

    def read_on_behalf(reader, consumers) -> bool:
        """Whether the standard library read a frame for one of its ``consumers``, functions that hand
        back only names and text: ``reader`` and the standard-library frames above it."""
        while reader is not None and reader.f_code.co_filename.startswith(library):
            code = reader.f_code
            if (code.co_filename[len(library) :], code.co_name) in consumers:
                return True
            reader = reader.f_back
        return False

    def importer(frame):
        while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
            frame = frame.f_back
        return frame

    def sensitive(event: str, args: tuple, caller) -> str | None:
        if event == "sys._getframe":
            return None if read_on_behalf(caller, name_probes) else event
        if event in events or event.startswith(event_prefixes):
            return event
        name = args[1] if event.startswith("object.") and type(args[1]) is str else None
        if event == "object.__getattr__" and name is not None:
            if name in frame_attributes:
                return None if read_on_behalf(caller, frame_readers) else f"read {name}"
            code = getattr(args[0], name, None) if type(args[0]) is function and name == "__code__" else None
            test = code is not None and (relative := checkout_path(code.co_filename)) and is_test(relative)
            if test and running_changed(caller):  # itself: inspect.signature of a test's function may
                return "read the code of a test"
            if code is answering:  # a function of its own running it would be answered (``hook``)
                return "read the guard's code"
        setting = event in ("object.__setattr__", "object.__delattr__") and name in ("__class__", "__bases__")
        if setting and foreign(args[0]) and code_under_test_asks():  # through the standard library too
            return f"change {name} of what the repository did not define"
        if event == "import" and type(args[0]) is str and args[0] in denied_modules:
            source = importer(caller)
            return f"import {args[0]}" if source is not None and running_changed(source) else None
        if event == "open" and protected_file(args[0]):
            return "open the tests' files, /proc or raw memory"
        return None

    def hook(event: str, args: tuple) -> None:
        if event == asked:  # a through_the_hook function: done here, where the originals are
            return act(args) if asking(lambda: getframe(3).f_code is answering) else None
        if event not in judged and not event.startswith(event_prefixes):
            return  # most events (exec, os.listdir ...) cost this one look-up
        if thread_id() in busy:  # the guard's own frame walk raises events too
            return
        if event == "compile" and type(args[1]) is str and asking(lambda: running_changed(getframe(3))):
            compiled.add(args[1])  # what it compiles itself is its own code, whatever name it gives the file
            return
        swapped = event == "object.__setattr__" and type(args[1]) is str and args[1] == "__code__"
        # another's function given the change's code, directly or through the standard library (functools)
        given = swapped and type(args[0]) is function and type(args[2]) is code_type and changed(args[2])
        if given and asking(lambda: not changed(args[0].__code__) and code_under_test_asks()):
            refuse("give its code to a function it did not write")
        made_code = swapped or event in ("marshal.loads", "code.__new__")
        if made_code and asking(lambda: running_changed(getframe(3))):
            refuse("make or swap code objects")  # itself: the standard library may (types.coroutine, importing)
        what = asking(lambda: sensitive(event, args, getframe(3)))
        if what is not None and asking(code_under_test_asks):
            refuse(what)

    def refuse(what: str) -> None:
        refusals.append(what[:200])
        raise refused(f"the code under test may not {what} (propel's guard, docs/swe.md)")

    def asking(question):
        """``question()`` with this thread's events ignored while it runs (it walks frames itself)."""
        me = thread_id()
        busy.add(me)
        try:
            return question()
        finally:
            busy.discard(me)

    def behind_the_guard(call, what: str):
        """``call`` refused to the change's code (for what raises no audit event)."""

        def guarded(*args, **kwargs):
            if asking(code_under_test_asks):
                refuse(what)
            return call(*args, **kwargs)

        return guarded

    set_handler, start_thread, defaults = _signal.signal, _thread.start_new_thread, (signal.SIG_DFL, signal.SIG_IGN)
    handlers = signal.Handlers

    def guarded_signal(signalnum, handler):
        default = type(handler) is int or handler is defaults[0] or handler is defaults[1]
        if not default and asking(code_under_test_asks):
            refuse("set a signal handler")
        before = set_handler(signalnum, handler)
        return handlers(before) if type(before) is int and before in (0, 1) else before  # as signal.signal answers

    def guarded_start(function, args, kwargs=None):
        taint = asking(code_under_test_asks)

        def run(*args, **kwargs):
            if taint:
                tainted.add(thread_id())
            return function(*args, **kwargs)

        return start_thread(run, args, kwargs or {})

    # the first frame of every thread started through the guard runs this code
    started = next(c for c in guarded_start.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == "run")
    create_builtin, create_dynamic, spec_of = _imp.create_builtin, _imp.create_dynamic, types.SimpleNamespace

    def afresh(create):
        """``create`` (the import system's maker of a builtin or extension module), refusing the
        change's code a second copy of a module the guard has put behind its check."""

        def guarded(spec, *args):
            name, origin = getattr(spec, "name", None), getattr(spec, "origin", None)
            if type(name) is not str or (origin is not None and type(origin) is not str):
                refuse("make a module from a spec of its own")
            if name in made and asking(code_under_test_asks):  # a second copy, the guard's wrappers left out
                refuse(f"make {name} afresh")
            made.add(name)
            return create(spec_of(name=str.__str__(name), origin=origin and str.__str__(origin)), *args)

        return guarded

    made = set(modules)  # builtin and extension modules made so far: the change may not make them again

    # what the hook does when asked (EVENT): the guarded originals, and the runners' two questions
    operations = {
        "signal": guarded_signal,
        "start": guarded_start,
        "_imp.create_builtin": afresh(create_builtin),
        "_imp.create_dynamic": afresh(create_dynamic),
        "refusals": lambda: tuple(refusals),
        "asks": lambda: asking(code_under_test_asks),
    }
    installed = [(_imp, "create_builtin"), (_imp, "create_dynamic")]
    for name in ("_posixsubprocess", "subprocess"):
        module = modules.get(name)
        attribute = "fork_exec" if name == "_posixsubprocess" else "_fork_exec"
        if module is not None and hasattr(module, attribute):
            operations[f"{name}.{attribute}"] = behind_the_guard(getattr(module, attribute), "start a process")
            installed.append((module, attribute))

    def act(args: tuple) -> None:
        """Do what a ``through_the_hook`` function asked: the operation's answer into its box."""
        operation, positional, keywords, box = args if len(args) == 4 else (None,) * 4
        if type(operation) is not str or operation not in operations or type(box) is not list:
            refuse("ask the guard for what it does not do")
        if type(positional) is not tuple or type(keywords) is not dict:
            refuse("ask the guard with arguments of its own making")
        list.append(box, operations[operation](*positional, **keywords))

    sys.addaudithook(hook)
    _signal.signal = signal.signal = through_the_hook("signal")
    _thread.start_new_thread = _thread.start_new = threading._start_new_thread = through_the_hook("start")
    for module, attribute in installed:
        setattr(module, attribute, through_the_hook(f"{module.__name__}.{attribute}"))
    modules.pop(__name__, None)  # nothing left to find by name (its state lives in the hook's closure)
    return through_the_hook("refusals"), through_the_hook("asks")


def as_a_user(
    folder: str, plugin: str | None = None, variables: tuple[str, ...] = (), command: list[str] | None = None
):
    """Take what propel put into this process's run out of what the code under test reads of it, so
    that it reads what a plain run in the sandbox reads (docs/swe.md, "Judged as used"): ``folder``
    (where the runner's files lie) out of ``sys.path``, its importer cache and ``PYTHONPATH``,
    ``plugin`` out of ``PYTEST_PLUGINS``, ``variables`` (libfaketime's) unset, and the arguments made
    those of a process started as ``python COMMAND``: ``sys.orig_argv`` the interpreter and
    ``command``, ``sys.argv`` what Python makes of them (``["-m", "pytest", "-q"]``: pytest's
    ``__main__`` and ``-q``; ``["-"]``, a program read from standard input: ``["-"]``). The variables
    change in ``os.environ`` and ``posix.environ`` only: the process's own environment, which
    libfaketime reads and child processes inherit, stays as it was."""
    import importlib.util
    import posix

    environ = os.environ

    def plain(name: str, value: str | None) -> None:
        key, raw = environ.encodekey(name), name.encode()
        environ._data.pop(key, None)
        posix.environ.pop(raw, None)
        if value:
            environ._data[key], posix.environ[raw] = environ.encodevalue(value), value.encode()

    parts = {"PYTHONPATH": (":", folder), "PYTEST_PLUGINS": (",", plugin)}
    for name, (separator, ours) in parts.items():
        if name in environ:
            plain(name, separator.join(part for part in environ[name].split(separator) if part and part != ours))
    for name in variables:
        plain(name, None)
    sys.path[:] = [entry for entry in sys.path if entry != folder]
    for entry in [entry for entry in sys.path_importer_cache if entry == folder or entry.startswith(folder + "/")]:
        del sys.path_importer_cache[entry]  # the folder, and the runner's own file, run as a script
    if command:
        sys.orig_argv[:] = [sys.orig_argv[0], *command]
        if command[0] == "-m":  # the module's file, as runpy sets it (a package's __main__)
            spec = importlib.util.find_spec(command[1])
            where = spec.submodule_search_locations if spec is not None else None
            main = os.path.join(where[0], "__main__.py") if where else spec.origin if spec else "-m"
            sys.argv[:] = [main, *command[2:]]
        else:
            sys.argv[:] = [*command]


def watch(prefixes: tuple[str, ...]):
    """A check that the machinery a runner calls after the test is as it was: every function, class
    and descriptor in the modules named by ``prefixes`` (and the classes they define), taken now,
    before any code of the repository runs. Setting a class's attribute raises no audit event, so a
    change could make pytest's ``Function.runtest`` or unittest's ``TestCase.run`` a no-op, or
    replace a module's function; the returned function lists what differs (empty when intact)."""
    import types

    kinds = (staticmethod, classmethod, property)
    class_dict, module_of = type.__dict__["__dict__"].__get__, type.__dict__["__module__"].__get__
    entries, classes = [], set()

    def kept(value) -> bool:
        return callable(value) or isinstance(value, kinds)

    def ours(name) -> bool:
        return type(name) is str and any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)

    for name, module in list(sys.modules.items()):
        if not ours(name) or type(module) is not types.ModuleType:
            continue
        namespace = module.__dict__
        for key, value in list(namespace.items()):
            if kept(value):
                entries.append((namespace, key, value, name))
            if isinstance(value, type) and id(value) not in classes and ours(module_of(value)):
                classes.add(id(value))
                members, where = class_dict(value), f"{name}.{value.__qualname__}"
                entries += [(members, k, v, where) for k, v in list(members.items()) if kept(v)]
    missing = object()

    def changed() -> list[str]:
        return [f"{at}.{key}" for namespace, key, value, at in entries if namespace.get(key, missing) is not value]

    return isolated(changed)
