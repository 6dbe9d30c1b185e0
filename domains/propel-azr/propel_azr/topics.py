"""A small deterministic topic classifier over a function's AST, for the top-topic diversity metric.

The first matching rule wins, so the order states which trait dominates a function that has several.
"""

from __future__ import annotations

import ast

STRING_METHODS = frozenset(
    {
        "upper",
        "lower",
        "split",
        "join",
        "replace",
        "strip",
        "capitalize",
        "startswith",
        "endswith",
        "isalpha",
        "isdigit",
        "islower",
        "isupper",
        "find",
        "index",
        "count",
        "title",
        "zfill",
        "ljust",
        "rjust",
    }
)
ORDER_CALLS = frozenset({"sorted", "sort", "min", "max", "reversed", "heappush", "heappop", "bisect_left"})


def topic_of(code: str) -> str:
    """One of: recursion, sorting/order, string manipulation, counting/mapping, list filtering,
    slicing/reversal, number theory, arithmetic, iteration, other."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "other"
    nodes = list(ast.walk(tree))
    calls = {_call_name(node) for node in nodes if isinstance(node, ast.Call)}
    function = next((node.name for node in tree.body if isinstance(node, ast.FunctionDef)), None)
    strings = any(isinstance(n, ast.Constant) and isinstance(n.value, str) for n in nodes)
    if function and function in calls:
        return "recursion"
    if calls & ORDER_CALLS:
        return "sorting/order"
    if calls & STRING_METHODS or (strings and calls & {"ord", "chr"}):
        return "string manipulation"
    if any(isinstance(n, ast.Dict | ast.DictComp) for n in nodes) or calls & {"get", "setdefault", "Counter"}:
        return "counting/mapping"
    if any(isinstance(n, ast.comprehension) and n.ifs for n in nodes) or "filter" in calls:
        return "list filtering"
    if any(isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) for n in nodes):
        return "slicing/reversal"
    if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod | ast.FloorDiv) for n in nodes):
        return "number theory"
    if any(isinstance(n, ast.BinOp) for n in nodes):
        return "arithmetic"
    if any(isinstance(n, ast.For | ast.While | ast.comprehension) for n in nodes):
        return "iteration"
    return "other"


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None
