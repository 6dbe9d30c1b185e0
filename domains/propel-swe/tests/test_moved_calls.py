"""The replay's moved calls leave the recorded shape (docs/swe.md, layer 4): arguments of other
types, passed by name, moved inside dicts, lists, sets and objects, and the recorded call made again
in a process that has made many calls. Each fix here is right for every call the tests make and
wrong for one shape the moved calls meet; before, each was solved. A revert and a harmless rewrite
of the same functions are still solved."""

import base64
import json
import pickle
import random
from collections import Counter, OrderedDict

import pytest
from test_replay_layer import attempt, one_module_domain, words_diff

from propel_swe import replayer, verifier

CORE = """\
def scale(value, factor):
    return value * factor


def total(prices):
    return sum(total(price) if isinstance(price, dict) else price for price in prices.values())
"""
TESTS = """\
from words.core import scale, total


def test_scale():
    assert scale(3, 4) == 12
    assert scale(2, 5) == 10


def test_total():
    assert total({"tea": 3, "cake": {"slice": 2, "whole": 5}}) == 10
    assert total({"jam": 1, "bread": {"loaf": 4, "roll": {"seeded": 2}}}) == 7
    assert total({"milk": 2, "cheese": {"hard": 6}}) == 8
"""
#: the dicts the tests hold with a dict inside, at every level
EXACT = (
    {"tea": 3, "cake": {"slice": 2, "whole": 5}},
    {"jam": 1, "bread": {"loaf": 4, "roll": {"seeded": 2}}},
    {"loaf": 4, "roll": {"seeded": 2}},
    {"milk": 2, "cheese": {"hard": 6}},
)
#: a bug in each function, and fixes each right for every call the tests make
BUGS = {
    "scale": ("    return value * factor\n", "    return value * factor + 1\n"),
    "total": ("total(price) if isinstance", "len(price) if isinstance"),
}
WRONG_FIXES = {
    "right only for ints": (
        "scale",
        "    return value * factor\n",
        "    return value * factor + (type(value) is not int or type(factor) is not int)\n",
    ),
    "right only for positional calls": (
        "scale",
        "def scale(value, factor):\n    return value * factor\n",
        "def scale(value, times):\n    return value * times\n",
    ),
    "right only for the first 300 calls of a process": (
        "scale",
        "def scale(value, factor):\n    return value * factor\n",
        "import itertools\n\nMADE = itertools.count(1)\n\n\n"
        "def scale(value, factor):\n    return value * factor + (next(MADE) > 300)\n",
    ),
    "right only one dict level deep": (
        "total",
        "total(price) if isinstance(price, dict) else price for price in prices.values()",
        "{'cake': 7, 'bread': 6, 'cheese': 6}.get(name, 0) if isinstance(price, dict) else price "
        "for name, price in prices.items()",
    ),
    "right only for the tests' dicts": (
        "total",
        "    return sum(total(price) if",
        f"    if prices in {EXACT}:\n"
        "        return sum(total(price) if isinstance(price, dict) else price for price in prices.values())\n"
        "    return sum(len(price) if",
    ),
}
RIGHT_FIXES = {
    "scale": (
        "def scale(value, factor):\n    return value * factor\n",
        "import functools\n\n\n@functools.lru_cache(maxsize=None)\ndef product(value, factor):\n"
        "    return value * factor\n\n\ndef scale(value, factor):\n    return product(value, factor)\n",
    ),
    "total": (
        "    return sum(total(price) if isinstance(price, dict) else price for price in prices.values())\n",
        "    whole = 0\n    for price in prices.values():\n"
        "        whole += total(price) if isinstance(price, dict) else price\n    return whole\n",
    ),
}


@pytest.fixture(scope="module")
def words_domain(test_env, tmp_path_factory):
    return one_module_domain("words", CORE, TESTS, test_env, tmp_path_factory)


@pytest.fixture(scope="module")
def verified(words_domain):
    """Each bug verified with 30 moved calls a recorded call, so that each way of moving one meets
    every recorded call; ``verifier.VARIANTS`` is read as the original's first replay is made."""
    patch = pytest.MonkeyPatch()
    patch.setattr(verifier, "VARIANTS", 30)
    payloads = {}
    for function, (old, new) in BUGS.items():
        payloads[function] = {"repo": "words", "diff": words_diff(CORE, CORE.replace(old, new)), "turns": ["x"]}
        validity = words_domain.verify(payloads[function])
        assert validity.valid, validity.reason
    patch.undo()
    return payloads


def graded(domain, payloads, function: str, old: str, new: str):
    buggy = CORE.replace(*BUGS[function])
    fixed = CORE.replace(old, new)
    assert fixed != CORE
    return domain.grade(payloads[function], attempt(words_diff(buggy, fixed)))


@pytest.mark.parametrize("fix", sorted(WRONG_FIXES))
def test_a_fix_right_only_for_the_recorded_shape_is_not_solved(words_domain, verified, fix):
    verdict = graded(words_domain, verified, *WRONG_FIXES[fix])
    assert verdict.solved is False, verdict.reason
    assert "the original code answers" in verdict.reason, verdict.reason


@pytest.mark.parametrize("function", sorted(BUGS))
def test_the_revert_is_still_solved(words_domain, verified, function):
    """No right fix is refused by the new moves: the original code answers them as a revert does."""
    verdict = words_domain.grade(verified[function], attempt(words_diff(CORE.replace(*BUGS[function]), CORE)))
    assert verdict.solved is True, verdict.reason


@pytest.mark.parametrize("function", sorted(BUGS))
def test_a_harmless_rewrite_is_still_solved(words_domain, verified, function):
    """A helper behind ``lru_cache`` (an int and the float it equals share its cache), a loop for ``sum``."""
    verdict = graded(words_domain, verified, function, *RIGHT_FIXES[function])
    assert verdict.solved is True, verdict.reason


class Point:
    def __init__(self, x, tags):
        self.x, self.tags = x, tags


class Hostile:
    """An object whose own code raises wherever a move could touch it."""

    def __init__(self):
        self.x = 1

    def __getattr__(self, name):
        raise RuntimeError(name)

    def __eq__(self, other):
        raise RuntimeError("eq")

    __hash__ = object.__hash__

    def __copy__(self):
        raise RuntimeError("copy")

    def __reduce_ex__(self, protocol):
        raise RuntimeError("reduce")


def test_every_shape_is_moved_in_a_copy_and_what_cannot_be_is_skipped():
    rng = random.Random(0)
    kinds = {
        (way, type(value), type(replayer.moved(value, rng, way)))
        for _ in range(30)
        for value in (3, 1, 2.5, True, "ab", b"ab", [1, 2], (1, 2), {1, 2}, frozenset({1}))
        for way in replayer.MOVES
    }
    for value, other in [(3, float), (1, bool), (2.5, int), (True, int), ("ab", bytes), (b"ab", str)]:
        assert ("other type", type(value), other) in kinds
    for value, other in [([1, 2], tuple), ((1, 2), list), ({1, 2}, frozenset), (frozenset({1}), set)]:
        assert ("other type", type(value), other) in kinds

    nested = {"a": 1, "b": {"c": [1, {"d": 2}]}}
    moves = [replayer.moved(nested, rng, "inside") for _ in range(200)]
    assert nested == {"a": 1, "b": {"c": [1, {"d": 2}]}}  # moved in copies
    assert any(move["a"] == 1 and move["b"]["c"][0] == 1 and move["b"]["c"][1] != {"d": 2} for move in moves)
    keys = [set(replayer.moved(nested, rng, "near")) for _ in range(50)]
    assert {"a"} in keys and {"b"} in keys and any(len(each) == 3 for each in keys)
    for mapping in (OrderedDict(a=1), Counter(a=1)):
        assert type(replayer.moved(mapping, rng, "inside")) is type(mapping)
    sizes = {len(replayer.moved({1, 2, 3}, rng, "near")) for _ in range(30)}
    assert sizes == {2, 4}

    point = Point(1, [2])
    moved_points = [replayer.moved(point, rng, "inside") for _ in range(30)]
    assert all(each is not point and type(each) is Point for each in moved_points)
    assert (point.x, point.tags) == (1, [2])
    assert any(each.x != 1 for each in moved_points) and any(each.tags != [2] for each in moved_points)

    for way in replayer.MOVES:
        assert replayer.moved(Hostile(), rng, way) is None
    assert replayer.moved([Hostile()], rng, "inside") is None
    cycle = []
    cycle.append(cycle)
    assert all(replayer.moved(cycle, rng, "inside") is not cycle for _ in range(20))  # as deep as MOVE_DEPTH


LAYOUT = {"positional": ["value", "factor"], "varargs": None, "keyword": [], "varkw": None}


def made(recorded, count=40):
    return [pickle.loads(base64.b64decode(call)) for call, _ in replayer.variants(recorded, random.Random(1), count)]


def test_moved_calls_pass_arguments_by_name_and_never_move_self():
    calls = made(("words.core", "scale", "function", LAYOUT, {"value": 3, "factor": 4}))
    layouts = {tuple(layout["keyword"]) for *_, layout, _ in calls}
    assert layouts == {(), ("factor",), ("value", "factor")}
    assert any(arguments == {"value": 3, "factor": 4} and layout["keyword"] for *_, layout, arguments in calls)

    method = {"positional": ["self", "other"], "varargs": None, "keyword": [], "varkw": None}
    point = Point(1, [2])
    calls = made(("words.core", "Point.merge", "method", method, {"self": point, "other": 2}))
    assert all(layout["positional"][:1] == ["self"] for *_, layout, _ in calls)
    assert all(vars(arguments["self"]) == {"x": 1, "tags": [2]} for *_, arguments in calls)

    hostile = made(("words.core", "scale", "function", LAYOUT, {"value": Hostile(), "factor": 4}))
    assert hostile == []  # what holds it cannot be pickled: no call is made, and nothing raised


def test_the_recorded_call_is_made_again_after_many_of_the_same():
    recorded = ("words.core", "scale", "function", LAYOUT, {"value": [], "factor": 4})
    call, shown = replayer.made_again(recorded, 500)
    *_, layout, arguments = pickle.loads(base64.b64decode(call))
    assert layout["calls_before"] == 500 and arguments == recorded[-1] and shown == "after 500 calls of the same"
    # each of the calls before is made with its arguments loaded afresh: the list it appends to is new
    counted = {"positional": ["items"], "varargs": None, "keyword": [], "varkw": None, "calls_before": 299}
    assert replayer.call_as_a_user(__name__, "count_call", "function", counted, {"items": []}) == 1
    assert CALLED == [1] * 300


CALLED = []


def count_call(items):
    items.append(1)
    CALLED.append(len(items))
    return len(items)


def test_a_right_fix_that_raises_otherwise_outside_what_the_function_takes_solves(tiny_domain, monkeypatch):
    """window(values, 2.0), a float moved in for the size: the original raises in ``range`` ("'float'
    object cannot be interpreted as an integer"), the fix, which counts its windows first, in the
    slice ("slice indices must be integers..."). An input outside what the function takes, worded by
    the interpreter: a moved call on which the original raised judges no change (before, this right
    fix was refused on that call's message)."""
    from test_replay_attacks import CORE, edit_core, graded, verified

    monkeypatch.setattr(verifier, "VARIANTS", 30)  # every way of moving the size is drawn
    before, buggy = "range(len(values) - size + 1)", "range(len(values) - size)"
    payload = verified(tiny_domain, edit_core(CORE, (before, buggy)))
    fix = edit_core(
        CORE.replace(before, buggy),
        (f"    return [values[i : i + size] for i in {buggy}]\n", "    count = int(len(values) - size) + 1\n"
         "    return [values[i : i + size] for i in range(count)]\n"),
    )  # fmt: skip
    verdict = graded(tiny_domain, payload, fix)
    assert verdict.solved is True, verdict.reason


def test_a_fix_that_returns_where_the_original_raised_on_a_moved_call_is_not_solved(tiny_domain, monkeypatch):
    """The error restored for the test's own empty list only: for an empty tuple, the list moved to
    another type, the original raises and this fix returns 0.0. On a moved call the original raised,
    a change must raise too (before, no such call was judged, and this fix was solved)."""
    from test_replay_attacks import CORE, edit_core, graded, verified

    monkeypatch.setattr(verifier, "VARIANTS", 30)  # the empty list is moved to a tuple for sure
    raising = '    if not values:\n        raise ValueError("mean of no values")\n'
    returning = "    if not values:\n        return 0.0\n"
    payload = verified(tiny_domain, edit_core(CORE, (raising, returning)))
    fix = edit_core(
        CORE.replace(raising, returning), (returning, raising.replace("not values", "values == []") + returning)
    )
    verdict = graded(tiny_domain, payload, fix)
    assert verdict.solved is False, verdict.reason


def test_a_replayers_line_whose_made_calls_are_not_calls_is_no_answer():
    """The line is read from a process that ran the code under test: a ``made`` that is no list of
    [call, as shown, index] reached ``in_order`` and raised TypeError there."""
    from propel_swe.replay import answers_of

    answer = [["d" * 64, "said", ["1"]]]
    assert answers_of(json.dumps([answer, [["call", "f(x=2)", "0"]]]))["made"] == [["call", "f(x=2)", "0"]]
    for made in (7, [7], [["call", "f(x=2)"]], [["call", "f(x=2)", 0]], [["call", "f(x=2)", "first"]]):
        assert answers_of(json.dumps([answer, made])) is None, made
