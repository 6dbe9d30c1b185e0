"""Exact countdown arithmetic: the solvability search and a safe expression evaluator.

Values are ints where possible and Fractions otherwise, so division is exact and fast in the common
case. Nothing here calls ``eval``: expressions are read with ``ast`` and walked.

A countdown answer may put a sign (unary ``-`` or ``+``) before any number or parenthesized part:
``-100 + x`` is still arithmetic over the given numbers with + - * /. Signs never make a positive
target reachable that was not reachable without them (a negative value built from positive numbers
has its negation buildable too), so the solvability search ignores them.
"""

from __future__ import annotations

import ast
from collections import Counter
from fractions import Fraction
from functools import lru_cache

Value = int | Fraction


def _exact(value: Fraction) -> Value:
    return value.numerator if value.denominator == 1 else value


def combine(x: Value, y: Value) -> set[Value]:
    """Every value one operation can make from x and y (both orders)."""
    out = {x + y, x * y, x - y, y - x}
    if y:
        out.add(_exact(Fraction(x) / y))
    if x:
        out.add(_exact(Fraction(y) / x))
    return out


@lru_cache(maxsize=4096)
def solvable(numbers: tuple[int, ...], target: int) -> bool:
    """Whether some expression over a subset of ``numbers`` (each at most once) equals ``target``.

    Reachable values are built per subset, smallest subsets first. The full set is never enumerated:
    for each split of it, each value x of one side is paired with the few values the other side would
    need (target - x, x - target, ...), looked up in its set.
    """
    n = len(numbers)
    full = (1 << n) - 1
    reach: dict[int, set[Value]] = {}
    for mask in sorted(range(1, full + 1), key=int.bit_count):
        if mask & (mask - 1) == 0:
            values = {numbers[mask.bit_length() - 1]}
        elif mask == full:
            return _completes(mask, reach, target)
        else:
            values = set()
            for left, right in _splits(mask):
                for x in reach[left]:
                    for y in reach[right]:
                        values |= combine(x, y)
        if target in values:
            return True
        reach[mask] = values
    return False  # a single number that is not the target


def _splits(mask: int):
    """Unordered pairs of non-empty disjoint submasks covering ``mask``."""
    sub = (mask - 1) & mask
    while sub:
        other = mask ^ sub
        if sub < other:
            yield sub, other
        sub = (sub - 1) & mask


def _completes(mask: int, reach: dict[int, set[Value]], target: int) -> bool:
    for left, right in _splits(mask):
        others = reach[right]
        for x in reach[left]:
            if _partners(x, target) & others or (x == 0 == target):
                return True
    return False


def _partners(x: Value, target: int) -> set[Value]:
    """The values y for which one operation on x and y gives ``target``."""
    needed = {target - x, x - target, target + x}  # x + y, x - y, y - x
    if x:
        needed |= {_exact(Fraction(target) / x), target * x}  # x * y, y / x
        if target:
            needed.add(_exact(Fraction(x) / target))  # x / y
    return needed


class ExpressionError(ValueError):
    """The expression is not a legal countdown answer; the message says why."""


_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_SIGNS = (ast.USub, ast.UAdd)
MAX_EXPRESSION_CHARS = 200


def evaluate(expression: str, numbers: list[int], signs: bool = False) -> Value:
    """The exact value of ``expression``, checking it uses only ``numbers``, each at most once.

    Integers, + - * / and parentheses only; with ``signs`` also a unary - or + before any number or
    parenthesized part (countdown answers: ``-100 + x``, ``-(a - b)``, ``--3``).
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ExpressionError(f"not an arithmetic expression ({type(exc).__name__})") from None
    used: Counter[int] = Counter()
    value = _walk(tree.body, used, signs)
    extra = used - Counter(numbers)
    if extra:
        raise ExpressionError(f"uses numbers not available: {sorted(extra.elements())}")
    return value


def _walk(node: ast.AST, used: Counter[int], signs: bool) -> Value:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used[node.value] += 1
        return node.value
    if signs and isinstance(node, ast.UnaryOp) and isinstance(node.op, _SIGNS):
        value = _walk(node.operand, used, signs)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _walk(node.left, used, signs), _walk(node.right, used, signs)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise ExpressionError("division by zero")
        return _exact(Fraction(left) / right)
    raise ExpressionError(f"only integers and + - * / are allowed, found {type(node).__name__}")
