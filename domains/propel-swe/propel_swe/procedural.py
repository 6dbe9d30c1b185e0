"""The procedural generator: one small AST mutation of non-test source, SWE-smith style, as a diff.

Model-free, so it gives real bugs on any machine and a baseline for the agent. Mutations: flip a
comparison, an off-by-one in arithmetic, an index or a range, swap two arguments, drop an
``if ...: return`` branch, flip a boolean constant, swap ``and``/``or``. Only the mutated node's
source is rewritten, so the rest of the file (comments, layout) stays as it was. Where preflight
recorded the lines the suite ran (``Baseline.lines_run``), only sites on those lines are mutated: code a
test imports but never runs (a platform's branch, a function no test calls) gives no bug, since no
test could fail on it. A repository's distinct mutants come in one seeded order (:class:`Mutants`),
and a run gives each of its episodes on that repository the next one, so no run plants the same bug
twice.
"""

from __future__ import annotations

import ast
import copy
import difflib
import random
from dataclasses import dataclass

from propel_swe.diffs import is_test_path

FLIPPED = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
MUTATIONS = ("flip_comparison", "off_by_one", "swap_arguments", "drop_return_branch", "flip_boolean", "swap_and_or")


@dataclass
class Site:
    path: str
    kind: str
    node: ast.AST


#: where code under test does not live, when preflight did not record what the suite imported: these
#: folders at the top of the checkout, and files of these names anywhere
NOT_CODE_FOLDERS = frozenset(
    {
        "doc",
        "docs",
        "documentation",
        "example",
        "examples",
        "benchmark",
        "benchmarks",
        "bench",
        "scripts",
        "tools",
        "ci",
        ".github",
    }
)
NOT_CODE_FILES = frozenset({"setup.py", "versioneer.py", "fabfile.py"})


def source_files(paths: list[str], imported: list[str] | None = None) -> list[str]:
    """The Python files of ``paths`` a bug may be planted in: never tests or test configuration. With
    ``imported`` (preflight's list of the files the suite imported) only those, so every mutant is in
    code some test runs; without it (an older preflight), every file but documentation, examples,
    tooling and packaging (``NOT_CODE_FOLDERS``, ``NOT_CODE_FILES``)."""
    code = [path for path in paths if path.endswith(".py") and not is_test_path(path)]
    if imported:
        wanted = set(imported)
        return [path for path in code if path in wanted]
    return [
        path
        for path in code
        if path.split("/", 1)[0] not in NOT_CODE_FOLDERS and path.rsplit("/", 1)[-1] not in NOT_CODE_FILES
    ]


def sites(path: str, tree: ast.AST) -> list[Site]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIPPED:
            found.append(Site(path, "flip_comparison", node))
        elif _arithmetic_index_or_range(node) and any(_is_int(child) for child in ast.iter_child_nodes(node)):
            found.append(Site(path, "off_by_one", node))
        if _swappable(node):
            found.append(Site(path, "swap_arguments", node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            found.append(Site(path, "flip_boolean", node))
        elif isinstance(node, ast.BoolOp):
            found.append(Site(path, "swap_and_or", node))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.For | ast.While | ast.If | ast.With):
            for statement in node.body[:-1]:  # never the last statement: the block must stay non-empty
                guard = isinstance(statement, ast.If) and not statement.orelse
                if guard and isinstance(statement.body[-1], ast.Return):
                    found.append(Site(path, "drop_return_branch", statement))
    return found


def ran(site: Site, lines_run: dict[str, list[int]]) -> bool:
    """Whether the suite ran ``site``'s code: a line of its node, or, for a dropped ``if ...: return``
    branch, a line of the branch's body (a guard that never held gives a bug nothing can fail on)."""
    node = site.node
    first, last = (
        (node.body[0].lineno, node.end_lineno) if site.kind == "drop_return_branch" else (node.lineno, node.end_lineno)
    )
    seen = lines_run.get(site.path, ())
    return any(line in seen for line in range(first, last + 1))


def _arithmetic_index_or_range(node: ast.AST) -> bool:
    is_range = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
    return is_range or isinstance(node, ast.BinOp | ast.Subscript)


def _swappable(node: ast.AST) -> bool:
    """A call with two different leading positional arguments."""
    if not isinstance(node, ast.Call) or len(node.args) < 2 or any(isinstance(a, ast.Starred) for a in node.args):
        return False
    return ast.dump(node.args[0]) != ast.dump(node.args[1])


def mutate(site: Site, source: str) -> str | None:
    """The file with ``site`` mutated, or None when the result does not parse or changes nothing."""
    lines = source.splitlines(keepends=True)
    node = site.node
    if site.kind == "drop_return_branch":
        first, last = node.lineno - 1, node.end_lineno
        if lines[first][: node.col_offset].strip() or lines[last - 1][node.end_col_offset :].strip():
            return None
        mutated = "".join(lines[:first] + lines[last:])
    else:
        replacement = _mutated_node(site.kind, node)
        start = _offset(lines, node.lineno, node.col_offset)
        end = _offset(lines, node.end_lineno, node.end_col_offset)
        encoded = source.encode()
        text = ast.unparse(replacement)
        if isinstance(replacement, ast.BinOp | ast.BoolOp | ast.Compare):
            text = f"({text})"  # stays one unit where it sits: a * (b + 1), not a * b + 1
        mutated = (encoded[:start] + text.encode() + encoded[end:]).decode()
    try:
        ast.parse(mutated)
    except SyntaxError:
        return None
    return mutated if mutated != source else None


def _mutated_node(kind: str, node: ast.AST) -> ast.AST:
    new = copy.deepcopy(node)
    if kind == "flip_comparison":
        new.ops = [FLIPPED[type(new.ops[0])]()]
    elif kind == "off_by_one":
        for child in ast.iter_child_nodes(new):
            if _is_int(child):
                child.value += 1
                break
    elif kind == "swap_arguments":
        new.args[0], new.args[1] = new.args[1], new.args[0]
    elif kind == "flip_boolean":
        new.value = not new.value
    elif kind == "swap_and_or":
        new.op = ast.Or() if isinstance(new.op, ast.And) else ast.And()
    return new


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Byte offset of (line, column) in the UTF-8 source; ast columns count bytes."""
    return sum(len(line.encode()) for line in lines[: lineno - 1]) + col


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
        )
    )


def site_order(files: dict[str, str], rng: random.Random, lines_run: dict[str, list[int]] | None = None) -> list[Site]:
    """Every mutation site of ``files`` (path -> source) that the suite ran (``ran``; every site where
    ``lines_run`` is None), in an order drawn from ``rng``: the kind of mutation first (uniformly among
    the kinds with sites left), then a site of that kind, so call-heavy code does not make nearly every
    bug an argument swap."""
    if lines_run is not None:
        lines_run = {path: set(lines) for path, lines in lines_run.items()}
    by_kind: dict[str, list[Site]] = {}
    for path in sorted(files):
        if not files[path].endswith("\n"):
            continue
        try:
            tree = ast.parse(files[path])
        except (SyntaxError, ValueError):
            continue
        for site in sites(path, tree):
            if lines_run is None or ran(site, lines_run):
                by_kind.setdefault(site.kind, []).append(site)
    for kind in sorted(by_kind):
        rng.shuffle(by_kind[kind])
    order = []
    while by_kind:
        kind = rng.choice(sorted(by_kind))
        order.append(by_kind[kind].pop())
        if not by_kind[kind]:
            del by_kind[kind]
    return order


class Mutants:
    """The distinct mutants of ``files`` (path -> source) in one order fixed by ``seed``: ``get(i)`` is
    the i-th, the same in any process whatever was asked before. Only sites on ``lines_run`` (the
    preflight's, path -> line numbers) where it is given. A site whose mutation does not parse or gives
    a diff an earlier mutant gave is skipped. Mutants are made only as far as asked for. Not
    thread-safe: callers that share one hold a lock."""

    def __init__(self, files: dict[str, str], seed: int, lines_run: dict[str, list[int]] | None = None):
        self.files, self.order = files, site_order(files, random.Random(seed), lines_run)
        self.made: list[tuple[str, str]] = []
        self._diffs: set[str] = set()
        self._next = 0

    def get(self, index: int) -> tuple[str, str] | None:
        """(description, diff) of mutant ``index``; None when there are not that many."""
        while len(self.made) <= index and self._next < len(self.order):
            site = self.order[self._next]
            self._next += 1
            mutated = mutate(site, self.files[site.path])
            if mutated is None:
                continue
            diff = unified_diff(site.path, self.files[site.path], mutated)
            if diff not in self._diffs:
                self._diffs.add(diff)
                self.made.append((f"{site.kind} at {site.path}:{getattr(site.node, 'lineno', 0)}", diff))
        return self.made[index] if index < len(self.made) else None

    def count(self) -> int:
        """How many distinct mutants there are (makes them all)."""
        self.get(len(self.order))
        return len(self.made)
