"""The replay (docs/swe.md, layer 4): the calls a bug's failing tests make into the repository, answered
again by the change's code outside the tests, in a process that holds no verdict, and compared in the
harness with the original code's answers. The attacks each layer stops alone are in test_hostile.py."""

import collections.abc
import json
import re

import pytest
from conftest import local_domain
from swe_helpers import BUG, reverted

from propel_swe import replayer, verifier
from propel_swe.checkout import git_checkout
from propel_swe.replay import Replay

CLAMP = "tests/test_core.py::test_clamp"


def attempt(diff: str) -> str:
    return json.dumps({"status": "finished", "turns": [], "diff": diff})


@pytest.fixture(scope="module")
def verified(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    assert tiny_domain.verify(payload).valid
    return payload


def test_a_verified_bug_carries_the_calls_its_tests_make_with_moved_ones(verified):
    replay = Replay.model_validate(verified["replay"])
    recorded = [shown for shown in replay.shown if " with " not in shown]
    assert recorded == [f"clamp(value={value}, low=0, high=10)" for value in (-5, 5, 15)]
    moved = [shown for shown in replay.shown if " with " in shown]
    # each recorded call's own, and clamp's first call again after many of the same (once a function)
    assert 1 <= len(moved) <= 3 * verifier.VARIANTS + 1 and all(shown.startswith("clamp(") for shown in moved)
    assert replay.judged == len(replay.calls)  # clamp is deterministic: every call is judged
    first = replay.said[replay.shown.index("clamp(value=15, low=0, high=10)")]
    assert first.startswith('[["returned",["number","10"]]')


def test_the_revert_is_judged_by_the_replay_and_solves(tiny_domain, verified):
    verdict = tiny_domain.grade(verified, attempt(reverted(BUG)))
    assert verdict.solved is True, verdict.reason
    assert verdict.diagnostics["judged_by"]["replayed"] == Replay.model_validate(verified["replay"]).judged


def test_a_fix_the_tests_accept_is_not_solved_on_inputs_no_test_holds(tiny_domain, monkeypatch):
    """Right for every input the tests hold (all have low=0), wrong once low moves: the moved calls
    meet it (30 a call, so one moves low for sure) and the reason names the call."""
    monkeypatch.setattr(verifier, "VARIANTS", 30)
    payload = {"repo": "tinystats", "diff": BUG, "turns": ["x"]}
    assert tiny_domain.verify(payload).valid
    only_low_zero = reverted(BUG).replace("+    if value > high:", "+    if value > high and low == 0:")
    assert only_low_zero != reverted(BUG)
    verdict = tiny_domain.grade(payload, attempt(only_low_zero))
    assert verdict.solved is False
    assert "with low=" in verdict.reason and "the original code answers" in verdict.reason, verdict.reason


def test_the_process_that_replays_a_change_is_never_given_the_answers(tiny_domain, verified, monkeypatch):
    replay = Replay.model_validate(verified["replay"])
    given = []
    fresh = verifier.fresh_process

    def watched(ws, repo, script, orders, time_limit, *args, **kwargs):
        given.append((script, json.dumps(orders)))
        return fresh(ws, repo, script, orders, time_limit, *args, **kwargs)

    monkeypatch.setattr(verifier, "fresh_process", watched)
    assert tiny_domain.grade(verified, attempt(reverted(BUG))).solved is True
    replays = [orders for script, orders in given if script == verifier.REPLAYER]
    assert len(replays) == 1
    assert not any(
        digest in replays[0] or said in replays[0] for digest, said in zip(replay.answers, replay.said, strict=True)
    )


def test_a_task_without_a_replay_is_graded_as_before(tiny_domain):
    payload = {"repo": "tinystats", "diff": BUG, "turns": [], "failing_tests": [CLAMP]}
    verdict = tiny_domain.grade(payload, attempt(reverted(BUG)))
    assert verdict.solved is True and verdict.diagnostics["judged_by"]["replayed"] == 0
    payload["replay"] = {"calls": "not a list"}
    verdict = tiny_domain.grade(payload, attempt(reverted(BUG)))
    assert verdict.solved is None and "verify it again" in verdict.reason


def test_a_description_holds_no_address_and_reads_what_an_iterator_gives():
    class Point:
        def __init__(self):
            self.x, self.y = 1, [2, 3]

    class Opaque:
        __slots__ = ()

    assert replayer.describe(Point()) == replayer.describe(Point())
    assert re.search("0x[0-9a-fA-F]", json.dumps(replayer.describe(Opaque()))) is None
    counted = ["iterator", [["number", "0"], ["number", "1"], ["number", "2"]]]
    assert replayer.describe(iter(range(3)))[1:] == replayer.describe(n for n in range(3))[1:] == counted
    assert replayer.describe({3, 1, 2}) == replayer.describe({2, 3, 1})
    assert replayer.describe(3.0) == replayer.describe(3) != replayer.describe(3.5)  # as == compares them
    assert json.loads(replayer.encoded(['é😀"\\', None, True])) == ['é😀"\\', None, True]
    assert replayer.describe(range(10**12))[1] == str(10**12)  # described without being listed


def test_moved_arguments_keep_their_type_and_never_touch_self():
    import random

    rng = random.Random(0)
    for value in (0, 7, -3, 2.5, "abc", (1, 2), [4], b"xy", range(3), True):
        moved = replayer.moved(value, rng)
        assert type(moved) is type(value) and moved != value
    assert replayer.moved(object(), rng) is None


def test_a_warning_is_part_of_what_a_call_answers():
    """A bug that drops a DeprecationWarning changes what its calls answer (more-itertools'
    zip_equal: a flipped version check silences it)."""
    import base64
    import contextlib
    import pickle

    layout = {"positional": ["message", "category"], "varargs": None, "keyword": [], "varkw": None}

    def answer(arguments):
        call = base64.b64encode(pickle.dumps(("warnings", "warn", "function", layout, arguments))).decode()
        return replayer.replay(call, 5.0, lambda seconds: contextlib.nullcontext(), lambda: (), TimeoutError)

    deprecated = answer({"message": "going", "category": DeprecationWarning})
    assert deprecated == answer({"message": "going", "category": DeprecationWarning})
    assert '"DeprecationWarning","going"' in deprecated[1]
    assert deprecated[0] != answer({"message": "going", "category": UserWarning})[0]
    assert deprecated[0] != answer({"message": "gone", "category": DeprecationWarning})[0]


def test_replayed_verdicts_are_the_same_graded_in_many_threads(tiny_domain, verified):
    """The replay's workspaces and processes are each grade's own: a revert, and a fix right only
    where pytest is loaded (the replay refuses it on a recorded call), graded from four threads at
    once as one by one."""
    from propel_core.testing import assert_same_verdicts_concurrently

    in_a_runner = reverted(BUG).replace(
        "+    if value > high:", '+    if value > (high if ("py" + "test") in __import__("sys").modules else low):'
    )
    graded = [(verified, attempt(reverted(BUG))), (verified, attempt(in_a_runner))]
    verdicts = [tiny_domain.grade(*pair) for pair in graded]
    assert [verdict.solved for verdict in verdicts] == [True, False]
    assert "the original code answers" in verdicts[1].reason, verdicts[1].reason
    assert_same_verdicts_concurrently(tiny_domain, graded, threads=4, rounds=2)


def test_a_description_compares_as_a_test_compares():
    """Values ``==`` makes equal are described alike whatever their class (a right fix that returns a
    Counter, a namedtuple, a str subclass, or a float from math.fsum is not refused), and what a test
    would see differ is described apart: an item past the first 200, a slot, an object's repr text
    without its address, an OrderedDict's order."""
    import math
    import statistics
    from collections import Counter, OrderedDict, defaultdict, namedtuple

    class Text(str):
        pass

    class Slotted:
        __slots__ = ("a", "b")

        def __init__(self, b):
            self.a, self.b = 1, b

    same = [
        (Counter(a=2), {"a": 2}), (defaultdict(int, a=2), {"a": 2}), (Text("hi"), "hi"), (frozenset({1}), {1}),
        (namedtuple("P", "x y")(1, 2), (1, 2)), (math.fsum([0.1] * 10), sum([0.1] * 10)), (True, True),
        (statistics.fmean([1, 2, 4]), 7 / 3), ("<Foo object at 0x7f00aa>", "<Foo object at 0x55bb01>"),
    ]  # fmt: skip
    for one, other in same:
        assert replayer.describe(one) == replayer.describe(other), (one, other)
    apart = [
        (list(range(300)), [*range(299), 0]), (Slotted([1]), Slotted([2])), ([1, 2], (1, 2)),
        (OrderedDict(a=1, b=2), OrderedDict(b=2, a=1)), (0.1, 0.1000001), ("<Foo at 0x1>", "<Bar at 0x1>"),
    ]  # fmt: skip
    for one, other in apart:
        assert replayer.describe(one) != replayer.describe(other), (one, other)


def test_a_replay_described_otherwise_is_not_compared():
    """A task verified by an older propel holds answers described otherwise: a fix is not judged on
    them (the other layers judge it), rather than refused for a difference of description."""
    assert Replay(answers=["a", ""], described=replayer.DESCRIBED).judged == 1
    assert Replay(answers=["a", ""]).judged == 0  # recorded before the description was numbered


class Buckets:
    """Pairs kept in hash buckets (as pyrsistent's PMap and PSet keep their items): how they are laid
    out follows the order they came in, and, for strings, the process's hash seed."""

    def __init__(self, pairs):
        self.buckets = [[] for _ in range(8)]
        for key, item in pairs:
            self.buckets[hash(key) % 8].append((key, item))

    def __iter__(self):
        return (key for bucket in self.buckets for key, _ in bucket)

    def __len__(self):
        return sum(len(bucket) for bucket in self.buckets)

    def __contains__(self, key):
        return any(key == each for each, _ in self.buckets[hash(key) % 8])


class Table(Buckets):
    def __getitem__(self, key):
        return next(item for each, item in self.buckets[hash(key) % 8] if each == key)

    def items(self):
        return [(key, self[key]) for key in self]


collections.abc.Mapping.register(Table)
collections.abc.Set.register(Buckets)


def test_a_mapping_or_set_that_is_no_dict_or_set_is_described_as_the_one_it_equals():
    """A registered ``Mapping`` or ``Set`` is described by its items, not by its buckets: the same
    items laid out otherwise are described alike, and as the dict or set they equal."""
    pairs = [(key, key * 2) for key in range(0, 24, 4)]  # 0, 8 and 16 share a bucket, 4, 12 and 20 another
    table, again = Table(pairs), Table(pairs[::-1])
    assert table.buckets != again.buckets
    assert replayer.describe(table) == replayer.describe(again) == replayer.describe(dict(pairs))
    assert replayer.describe(table) != replayer.describe(Table(pairs[1:]))
    members, reordered = Buckets((key, None) for key, _ in pairs), Buckets((key, None) for key, _ in pairs[::-1])
    assert replayer.describe(members) == replayer.describe(reordered) == replayer.describe({key for key, _ in pairs})
    assert replayer.describe(members) != replayer.describe(Table(pairs))


HASHED = """\
import collections.abc


class Tally:
    \"\"\"Counts kept in hash buckets, as pyrsistent's PMap keeps its items: a Mapping by registration.\"\"\"

    def __init__(self, pairs):
        self.buckets = [[] for _ in range(8)]
        for word, count in pairs:
            self.buckets[hash(word) % 8].append((word, count))

    def __getitem__(self, word):
        return next(count for each, count in self.buckets[hash(word) % 8] if each == word)

    def __iter__(self):
        return (word for bucket in self.buckets for word, _ in bucket)

    def __len__(self):
        return sum(len(bucket) for bucket in self.buckets)

    def items(self):
        return [(word, self[word]) for word in self]

    def __eq__(self, other):
        return dict(self.items()) == dict(other.items())

    def __reduce__(self):  # pickled by its items, laid out again where it loads
        return Tally, (self.items(),)


collections.abc.Mapping.register(Tally)


def tally(words):
    return Tally([(word, words.count(word)) for word in set(words)])


def distinct(words):
    return list(set(words))
"""
HASHED_TESTS = """\
from words.core import distinct, tally

WORDS = ["fig", "cherry", "apple", "elder", "banana", "date", "apple"]


def test_tally():
    assert tally(WORDS) == {word: 2 if word == "apple" else 1 for word in WORDS}


def test_distinct():
    assert sorted(distinct(WORDS)) == sorted(set(WORDS))
"""
#: a bug in each function: what its calls return is laid out, or ordered, by the process's hash seed
HASHED_BUGS = {
    "tally": ("    return Tally([(word, words.count(word)) for", "    return Tally([(word, words.count(word) + 1) for"),
    "distinct": ("    return list(set(words))", "    return list(set(words[1:]))"),
}


def words_diff(before: str, after: str, path: str = "words/core.py") -> str:
    import difflib

    lines = difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}")
    return "".join(lines)


def one_module_domain(name: str, core: str, tests: str, test_env, tmp_path_factory):
    """The swe domain on a repository of one package ``name``, its ``core.py`` holding ``core``, and
    one test file, ``tests/test_NAME.py``, holding ``tests``."""
    repo = tmp_path_factory.mktemp("repos") / name
    (repo / name).mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / name / "__init__.py").write_text("")
    (repo / name / "core.py").write_text(core)
    (repo / "tests" / f"test_{name}.py").write_text(tests)
    return local_domain(name, git_checkout(repo), test_env, tmp_path_factory.mktemp(name))


@pytest.fixture(scope="module")
def hashed_domain(test_env, tmp_path_factory):
    return one_module_domain("words", HASHED, HASHED_TESTS, test_env, tmp_path_factory)


@pytest.mark.parametrize("function", sorted(HASHED_BUGS))
def test_a_bug_in_what_iterates_in_hash_order_is_valid_and_its_revert_solves_it(hashed_domain, function):
    """pyrsistent's case: the original's two replays and the revert's each ran with a hash seed of
    their own, so what a call answered (a Tally's buckets, a list made from a set of strings) differed
    between processes: the bug was refused (no stable answer it changed) or its revert refused. One
    hash seed a verification, given to each replay, and a mapping described by its items make both
    verdicts right."""
    buggy = HASHED.replace(*HASHED_BUGS[function])
    payload = {"repo": "words", "diff": words_diff(HASHED, buggy), "turns": ["x"]}
    validity = hashed_domain.verify(payload)
    assert validity.valid, validity.reason
    verdict = hashed_domain.grade(payload, attempt(words_diff(buggy, HASHED)))
    assert verdict.solved is True, verdict.reason
    replay = Replay.model_validate(payload["replay"])
    assert replay.judged == len(replay.calls) and replay.hash_seed is not None  # every answer the same twice
