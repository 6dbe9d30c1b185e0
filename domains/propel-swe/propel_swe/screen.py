"""The static screen every bug and every fix passes before its suite runs (one set of rules for both).

The code under test runs in the same process as the test runner, so a diff that reaches the runner
or the interpreter's internals could write its own verdict. The screen reads the source of each file
a diff changed, before and after, and refuses what the diff *adds* (a feature the file already had
is not the diff's doing, so real code that uses ``sys`` or ``getattr`` stays editable):

- an import of the test machinery or the interpreter's internals (``pytest``, ``_pytest``, propel's
  modules, ``gc``, ``inspect``, ``ctypes``, ``importlib``, ``signal``, ``atexit``, ``builtins``,
  threads and processes), and string constants naming pytest or propel (``sys.modules['_pytest...']``);
- the frame, code and process machinery: ``sys._getframe``, ``sys.settrace``/``setprofile``,
  ``sys.modules``, ``os._exit``, ``os.kill``, ``os.write``/``dup2`` (a descriptor of the runner's),
  frame and code attributes (``f_back``, ``__code__``, ``__globals__`` ...), ``__import__``, ``eval``,
  ``exec``, ``compile``, ``globals``, ``vars``, and ``getattr``/``setattr``/``delattr`` on a module by a
  computed name;
- replacing an attribute of a module (``json.dumps = ...``): what the runner calls after the test;
- comparison and hashing methods (``__eq__``, ``__hash__`` ...) that ignore an argument, so a value
  equal to everything cannot pass an assertion, and hooks the interpreter calls while a module is
  being imported or torn down (``__init_subclass__``, ``__set_name__``, ``__del__`` ...);
- a call made at import time that the file did not make before: a new decorator, a new call in a
  module-level statement, a class keyword or a default value (code at import time runs before any
  test, where it can reach the runner unseen). Changing the arguments of an existing call, or a
  constant, is allowed: that is what bugs are made of.

Like the AZR filter it is a quality filter, not a security boundary: no static screen of Python is
complete (a name can be reached through objects the screen cannot follow). The verdict's other layers,
two runners that must agree and the environment and clock rechecks (``verifier``), do not rely on it.
"""

from __future__ import annotations

import ast
import builtins
import functools
import re
from collections import Counter

FORBIDDEN_MODULES = frozenset(
    {"pytest", "_pytest", "pluggy", "py", "gc", "inspect", "ctypes", "importlib", "signal", "atexit", "builtins",
     "threading", "_thread", "multiprocessing", "subprocess", "faulthandler", "sysconfig", "site", "code", "pdb",
     "trace", "tracemalloc", "traceback", "weakref", "types", "marshal", "pickle", "runpy", "pty", "posix"}
)  # fmt: skip
FORBIDDEN_PREFIXES = ("propel",)  # propel's own modules, its report plugin included
#: module.attribute pairs the runner's process must keep for itself
FORBIDDEN_QUALIFIED = frozenset(
    {"sys._getframe", "sys.settrace", "sys.setprofile", "sys.modules", "sys.meta_path", "sys.path_hooks",
     "sys.addaudithook", "sys.exit", "sys.excepthook", "sys.stdout", "sys.stderr", "sys.__stdout__",
     "sys.__stderr__", "os._exit", "os.kill", "os.killpg", "os.abort", "os.fork", "os.forkpty", "os.write",
     "os.writev", "os.dup", "os.dup2", "os.close", "os.closerange", "os.open", "os.fdopen", "os.system",
     "os.popen", "os.execv", "os.execve", "os.execl", "os.execvp", "os.spawnv", "os.posix_spawn", "os.environ",
     "os.environb", "os.getenv", "os.getenvb", "os.putenv", "os.unsetenv", "os.setsid", "os.chdir", "os.sys"}
)  # fmt: skip
#: attribute names that lead to frames, code, the import system or every class, whatever holds them
FORBIDDEN_ATTRIBUTES = frozenset(
    {"_getframe", "settrace", "setprofile", "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "f_trace",
     "gi_frame", "gi_code", "cr_frame", "ag_frame", "tb_frame", "tb_next", "__code__", "__globals__",
     "__builtins__", "__import__", "__subclasses__", "__loader__", "__spec__", "__closure__", "__func__",
     "__dict__", "__traceback__", "__self__", "__class__", "__base__", "__bases__", "__mro__", "mro", "modules",
     "sys"}
)  # fmt: skip
FORBIDDEN_NAMES = frozenset(
    {"__import__", "__builtins__", "eval", "exec", "compile", "globals", "locals", "vars", "breakpoint",
     "__loader__", "__spec__"}
)  # fmt: skip
COMPARISONS = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__"})
IMPORT_HOOKS = frozenset(
    {"__init_subclass__", "__set_name__", "__prepare__", "__del__", "__class_getitem__", "__getattr__",
     "__getattribute__", "__instancecheck__", "__subclasscheck__"}
)  # fmt: skip
# string constants that name the runner, or the kernel's view of the process and the machine (where a
# bug would read the boot time past a moved clock, or the preloaded library that moves it)
NAMING = ("pytest", "propel", "/proc", "/sys/")
COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)
ACCESSORS = ("getattr", "setattr", "delattr", "hasattr")


def screen(before: dict[str, str], after: dict[str, str], original: dict[str, str] | None = None) -> list[str]:
    """Why the change from ``before`` to ``after`` (path -> Python source, the files a diff changed)
    is refused, one line per problem; empty when it passes. What the repository's own file had
    (``original``: a fix's ``before`` is the bug, its ``original`` the clean checkout) is never a
    diff's invention, so a fix may restore what a bug removed. A file the screen cannot parse after
    the change is refused: what it cannot read, it does not pass."""
    problems = []
    for path in sorted(after):
        new = features(after[path])
        if new is None:
            problems.append(f"{path}: does not parse (the screen passes nothing it cannot read)")
            continue
        known = (features(before.get(path, "")) or Counter()) | (features((original or {}).get(path, "")) or Counter())
        problems += [f"{path}: {feature[:120]}" for feature in sorted(new - known)]
    return problems


def features(source: str) -> Counter[str] | None:
    """What a file's code can reach and what it runs at import time, as counted features; None when
    it does not parse. Remembered per source (a repository's clean files are screened against again
    and again)."""
    found = _features(source)
    return None if found is None else Counter(found)


@functools.lru_cache(maxsize=256)
def _features(source: str) -> Counter[str] | None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found: Counter[str] = Counter()
    for encoding in COOKIE.findall("\n".join(source.splitlines()[:2])):
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            found[f"declares the source encoding {encoding}"] += 1  # Python would read other code than this
    modules = _module_names(tree)
    for node in ast.walk(tree):
        found.update(_reach(node, modules))
    found.update(f"calls {name} at import time" for name in _import_time_calls(tree.body))
    return found


def _module_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it names, for the names imports bind (``import os as _os``: _os -> os;
    ``from os import write``: write -> os.write)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):  # a module passed on by assignment (m = os) is still that module
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in names:
            names.update({target.id: names[node.value.id] for target in node.targets if isinstance(target, ast.Name)})
    return names


def _reach(node: ast.AST, modules: dict[str, str]) -> list[str]:
    """The features one node adds: what it imports or names that reaches the runner or the internals."""
    if isinstance(node, ast.Import):
        return [f"imports {alias.name}" for alias in node.names if _forbidden_module(alias.name)]
    if isinstance(node, ast.ImportFrom):
        module = node.module or ""
        found = [f"imports {module}"] if _forbidden_module(module) else []
        return found + [
            f"imports {module}.{a.name}"
            for a in node.names
            if f"{module}.{a.name}" in FORBIDDEN_QUALIFIED or a.name == "sys" or _forbidden_module(a.name)
        ]
    patched = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del)
    if patched and isinstance(node.value, ast.Name) and node.value.id in modules:  # json.dumps = ...
        return [f"replaces {modules[node.value.id]}.{node.attr}"]
    if isinstance(node, ast.Name):
        qualified = modules.get(node.id, "")
        if node.id in FORBIDDEN_NAMES:
            return [f"uses {node.id}"]
        return [f"uses {qualified}"] if qualified in FORBIDDEN_QUALIFIED else []
    if isinstance(node, ast.Attribute):
        if node.attr in FORBIDDEN_ATTRIBUTES:
            return [f"uses the attribute {node.attr}"]
        if isinstance(node.value, ast.Name) and f"{modules.get(node.value.id)}.{node.attr}" in FORBIDDEN_QUALIFIED:
            return [f"uses {modules[node.value.id]}.{node.attr}"]
        return []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS and node.args:
        name = node.args[1] if len(node.args) > 1 else None
        constant = isinstance(name, ast.Constant) and isinstance(name.value, str)
        if constant and (name.value in FORBIDDEN_ATTRIBUTES or name.value in FORBIDDEN_NAMES):
            return [f"uses the attribute {name.value}"]
        receiver = node.args[0].id if isinstance(node.args[0], ast.Name) else None
        on_a_module = receiver in modules or hasattr(builtins, receiver or "")
        return [f"calls {node.func.id} with a computed name on a module"] if on_a_module and not constant else []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
        first = node.args[0] if node.args else None
        if any(k.arg == "closefd" for k in node.keywords) or (
            isinstance(first, ast.Constant) and type(first.value) is int
        ):
            return ["opens a descriptor"]
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        text = node.value.lower() if isinstance(node.value, str) else node.value.decode(errors="replace").lower()
        return [f"names {word} in a string" for word in NAMING if word in text]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        if node.name in IMPORT_HOOKS:
            return [f"defines {node.name}"]
        if node.name in COMPARISONS and _ignores_an_argument(node):
            return [f"defines {node.name} that ignores an argument"]
    return []


def _forbidden_module(name: str) -> bool:
    top = name.split(".")[0]
    return top in FORBIDDEN_MODULES or top.startswith(FORBIDDEN_PREFIXES)


def _ignores_an_argument(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether some parameter is never read in the body (``def __eq__(self, other): return True``)."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    read = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return any(name not in read for name in names)


def _import_time_calls(body: list[ast.stmt]) -> list[str]:
    """The callee of every call the statements make when the module is imported: calls in
    module-level and class-level code, decorators (applying one is a call), class keywords, default
    values and annotations; not what runs inside a function when it is called."""
    calls = []
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending += [*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)]
            calls += [ast.unparse(d) for d in node.decorator_list if not isinstance(d, ast.Call)]
            continue
        if isinstance(node, ast.Lambda):
            pending += [*node.args.defaults, *filter(None, node.args.kw_defaults)]
            continue
        if isinstance(node, ast.ClassDef):
            calls += [ast.unparse(d) for d in node.decorator_list if not isinstance(d, ast.Call)]
            calls += [f"{ast.unparse(k.value)} as {k.arg}" for k in node.keywords]
        if isinstance(node, ast.Call):
            calls.append(ast.unparse(node.func))
        pending += list(ast.iter_child_nodes(node))
    return calls
