"""The static screen every bug and every fix passes before its suite runs (one set of rules for both).

What the code a change writes may *do* while the suite runs is denied at run time, by the interpreter
(``guard``: frames, ``gc``, ``ctypes``, processes, the tests' files) and by the runners themselves
(they check that the machinery they call is unchanged, and answer on channels the code cannot
name). The screen keeps only what no run can see, read from each changed file's source before and
after the change; it refuses what the change *adds* (a feature the file already had, or for a fix
the clean file had, is not the change's doing):

- a comparison or hashing method (``__eq__``, ``__hash__`` ...) that ignores an argument, or one set
  by assignment (a lambda, ``C.__eq__ = ...``, ``setattr``): a value equal to everything passes a
  test's assertion for real, under any runner. A body that reads its argument and still answers
  True passes (``return (self, other) is not None``): what a method computes, no screen can read;
  that is a residual (docs/swe.md, "What remains");
- a string that names the test machinery as code names it (``pytest``, ``_pytest``, ``unittest``,
  ``pluggy``, ``propel``, ``PYTEST_CURRENT_TEST``): a short string without
  spaces, not a docstring, since prose that mentions pytest is ordinary. Code that asks whether a
  runner is loaded can behave only while tested; this rule catches the plain spelling of that;
- a coding cookie other than UTF-8 (Python would run other code than the text screened), and a file
  it cannot parse (what it cannot read, it does not pass).

Features are compared as sets: writing one more of what the file already has (a second
``@property``, another ``getattr``) adds nothing new.
"""

from __future__ import annotations

import ast
import functools
import re

COMPARISONS = frozenset({"__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__"})
# names of the test machinery and the kernel's view of the process, as code spells them
NAMING = ("pytest", "unittest", "pluggy", "propel")
COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)


def screen(before: dict[str, str], after: dict[str, str], original: dict[str, str] | None = None) -> list[str]:
    """Why the change from ``before`` to ``after`` (path -> Python source, the files a change
    touched) is refused, one line per problem; empty when it passes. What the repository's own file
    had (``original``: a fix's ``before`` is the bug, its ``original`` the clean checkout) is never
    the change's invention, so a fix may restore what a bug removed."""
    problems = []
    for path in sorted(after):
        new = features(after[path])
        if new is None:
            problems.append(f"{path}: does not parse (the screen passes nothing it cannot read)")
            continue
        known = (features(before.get(path, "")) or frozenset()) | (
            features((original or {}).get(path, "")) or frozenset()
        )
        problems += [f"{path}: {feature[:120]}" for feature in sorted(new - known)]
    return problems


@functools.lru_cache(maxsize=256)
def features(source: str) -> frozenset[str] | None:
    """What in a file's code the screen refuses when a change adds it; None when it does not parse.
    Remembered per source (a repository's clean files are screened against again and again)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    found = set()
    for encoding in COOKIE.findall("\n".join(source.splitlines()[:2])):
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            found.add(f"declares the source encoding {encoding}")  # Python would read other code than this
    docstrings = {id(node.body[0].value) for node in ast.walk(tree) if _has_docstring(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in docstrings:
            found.update(_names(node.value))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in COMPARISONS:
            found.update([f"defines {node.name} that ignores an argument"] if _ignores_an_argument(node) else [])
        elif name := _assigned_comparison(node):
            found.add(f"assigns {name}")  # a lambda or a function from elsewhere: its body is not read here
    return frozenset(found)


def _has_docstring(node: ast.AST) -> bool:
    body = getattr(node, "body", None)
    if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) or not body:
        return False
    return isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def _names(value: str | bytes) -> list[str]:
    """The machinery a string names, when it is spelled as code spells it (no whitespace)."""
    text = value.lower() if isinstance(value, str) else value.decode(errors="replace").lower()
    if not text or any(character.isspace() for character in text):
        return []
    return [f"names {word} in a string" for word in NAMING if word in text]


def _assigned_comparison(node: ast.AST) -> str | None:
    """The comparison method a statement sets by assignment (``__eq__ = lambda s, o: True`` in a class
    body, ``C.__eq__ = ...``, ``setattr(C, "__eq__", ...)``); None for anything else."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    for target in targets:
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None
        if name in COMPARISONS:
            return name
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args[1:]:
        name = node.args[1]
        if isinstance(name, ast.Constant) and name.value in COMPARISONS:
            return name.value
    return None


def _ignores_an_argument(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether some parameter is never read in the body (``def __eq__(self, other): return True``)."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    read = {node.id for node in ast.walk(function) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return any(name not in read for name in names)
