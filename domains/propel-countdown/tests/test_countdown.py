"""The countdown domain: registration, solvability search, safe evaluation, parsing and grading."""

import functools
import itertools
import random
import re
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from propel_core.domain import ParseError, make_task
from propel_core.plugins import Registry
from propel_core.testing import assert_same_verdicts_concurrently
from propel_countdown.arithmetic import ExpressionError, evaluate, solvable


def test_shows_up_in_propel_plugins(propel_registry):
    described = {p["name"]: p for p in propel_registry.describe()}
    assert described["countdown"]["registers"] == {
        "domains": ["countdown"],
        "validity_predicates": ["countdown_rules", "countdown_solvable"],
    }


@pytest.fixture
def domain(propel_registry):
    return propel_registry.domain("countdown")


@pytest.fixture
def predicates(propel_registry, domain):
    return propel_registry.validity_predicates(domain)


def brute_force(numbers, target):
    """Every value of every expression tree over every ordered subset: slow, obviously right."""

    def values(items):
        if len(items) == 1:
            yield Fraction(items[0])
            return
        for split in range(1, len(items)):
            for left in values(items[:split]):
                for right in values(items[split:]):
                    yield from (left + right, left - right, left * right)
                    if right:
                        yield left / right

    return any(
        value == target
        for size in range(1, len(numbers) + 1)
        for subset in itertools.permutations(numbers, size)
        for value in values(subset)
    )


def test_search_agrees_with_brute_force():
    rng = random.Random(0)
    for _ in range(150):
        numbers = tuple(sorted(rng.randint(1, 12) for _ in range(rng.randint(2, 4))))
        target = rng.randint(1, 120)
        assert solvable(numbers, target) == brute_force(numbers, target), (numbers, target)


@pytest.mark.parametrize(
    ("numbers", "target", "expected"),
    [
        ((3, 8, 8), 24, True),
        ((1, 5, 5, 5), 24, True),
        ((2, 3), 7, False),
        ((1, 1, 1, 1, 1, 1), 10, False),
        ((1, 1, 1, 1, 1, 1), 9, True),
        ((3, 6, 25, 50, 75, 100), 952, True),
    ],
)
def test_known_puzzles(numbers, target, expected):
    assert solvable(numbers, target) is expected


def test_evaluate_exact_and_checks_numbers():
    assert evaluate("8 / (3 - 8 / 3)", [3, 3, 8, 8]) == 24
    assert evaluate("(5 - 1/5) * 5", [1, 5, 5, 5]) == 24
    with pytest.raises(ExpressionError, match=r"not available: \[5\]"):
        evaluate("5 + 5", [5, 3])
    with pytest.raises(ExpressionError, match="division by zero"):
        evaluate("3 / (2 - 2)", [3, 2, 2])


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('echo hi')", "2 ** 10", "-3 + 5", "abs(3)", "(3).real", "3.5 + 1", "[3][0]", "x + 1"],
)
def test_evaluate_rejects_everything_but_arithmetic(expression):
    with pytest.raises(ExpressionError):
        evaluate(expression, [3, 5, 10, 1, 2, 0])


SIGNED = [100, 92, 24, 15, 83, 5]  # -100 + (92*(24 + 15) - 83)/5 = -100 + 3505/5 = 601


@pytest.mark.parametrize(
    ("signed", "unsigned"),
    [
        ("-100 + (92*(24 + 15) - 83)/5", "(92*(24 + 15) - 83)/5 - 100"),
        ("-100+(92*(24+15)-83)/5", "(92*(24+15)-83)/5-100"),
        ("- 100 + ( 92 * ( 24 + 15 ) - 83 ) / 5", "( 92 * ( 24 + 15 ) - 83 ) / 5 - 100"),
        ("-(83 - 92*(24 + 15))/5 - 100", "(92*(24 + 15) - 83)/5 - 100"),
        ("--(92*(24 + 15) - 83)/5 - 100", "(92*(24 + 15) - 83)/5 - 100"),
        ("+(92*(24 + 15) - 83)/5 + -100", "(92*(24 + 15) - 83)/5 - 100"),
        ("-(100 - (92*(24 + 15) - 83)/5)", "(92*(24 + 15) - 83)/5 - 100"),
        ("-(24 - 15)", "15 - 24"),
        ("-5 * (83 - 92)", "5 * (92 - 83)"),
        ("-5 * -(92 - 83)", "5 * (92 - 83)"),
        ("- - -24", "0 - 24"),
        ("24 - -15", "24 + 15"),
    ],
)
def test_signed_answers_grade_like_their_unsigned_forms(signed, unsigned):
    numbers = [*SIGNED, 0]  # "0 - 24" spells a lone negation without signs
    assert evaluate(signed, numbers, signs=True) == evaluate(unsigned, numbers)
    with pytest.raises(ExpressionError, match="found UnaryOp"):
        evaluate(signed, numbers)  # the default (the arithmetic domain's) has no signs


@pytest.mark.parametrize(
    "attempt",
    [
        "<answer>-100 + (92*(24 + 15) - 83)/5</answer>",
        "<answer>(92*(24 + 15) - 83)/5 - 100</answer>",
        "<answer>-100+(92*(24+15)-83)/5 = 601</answer>",
        "<answer>--(92*(24 + 15) - 83)/5 + -100</answer>",
    ],
)
def test_grader_accepts_a_leading_minus(domain, attempt):
    verdict = domain.grade({"numbers": SIGNED, "target": 601}, attempt)
    assert (verdict.solved, verdict.reason) == (True, None)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("-(-100 + (92*(24 + 15) - 83)/5)", "expression equals -601, not 601"),
        ("-2 ** 3", "found BinOp"),
        ("-abs(100)", "found Call"),
        ("~100 + 92", "found UnaryOp"),
        ("not 100", "found UnaryOp"),
        ("-100.0 + 92", "found Constant"),
        ("-100 - -100", r"not available: \[100\]"),
        ("-1005 + 92", r"not available: \[1005\]"),
        ("-x", "found Name"),
    ],
)
def test_grader_refuses_signs_on_anything_but_arithmetic(domain, expression, reason):
    verdict = domain.grade({"numbers": SIGNED, "target": 601}, f"<answer>{expression}</answer>")
    assert verdict.solved is False and re.search(reason, verdict.reason), verdict


def test_parse_and_render(domain):
    payload = domain.parse("Sure!\nNumbers: 4, 7, 25, 50\nTarget: 129\nHope it's fun.")
    assert payload == {"numbers": [4, 7, 25, 50], "target": 129}
    assert domain.parse(domain.render(payload)) == payload
    assert domain.parse("Target: 24\nNumbers: [3, 8, 8]") == {"numbers": [3, 8, 8], "target": 24}
    with pytest.raises(ParseError, match="the target is not an integer"):
        domain.parse("Target: <+175>\nNumbers: 28, 7, 98\nTarget: 7")
    with pytest.raises(ParseError, match="no 'Numbers:' line"):
        domain.parse("Target: 5")
    with pytest.raises(ParseError, match="no 'Target:' line"):
        domain.parse("Numbers: 5, 6")
    with pytest.raises(ParseError, match="not all integers"):
        domain.parse("Numbers: 3, five, 7\nTarget: 12")


def test_validity(domain, predicates):
    context = domain.contexts()[0]
    check = lambda text: make_task("t", domain, context, text, "m", predicates).validity  # noqa: E731
    assert check("Numbers: 3, 8, 8\nTarget: 24").valid
    assert check("Numbers: 3, 8\nTarget: 24").reason == "countdown_rules: needs 3-6 numbers"
    assert check("Numbers: 3, 8, 800\nTarget: 24").reason == "countdown_rules: numbers must lie in 1..100"
    assert check("Numbers: 3, 8, 24\nTarget: 24").reason == "countdown_rules: target is one of the numbers (trivial)"
    assert check("Numbers: 1, 1, 1\nTarget: 97").reason == "countdown_solvable: target unreachable from the numbers"


def test_contexts_are_solvable_examples(domain):
    contexts = domain.contexts()
    assert len(contexts) == 64 and len({c.id for c in contexts}) == 64
    for context in contexts:
        for example in context.data["examples"]:
            assert len(example["numbers"]) == context.data["count"]
            assert solvable(tuple(sorted(example["numbers"])), example["target"])


@pytest.mark.parametrize(
    ("attempt", "solved", "reason", "flags"),
    [
        ("<think>8/(3-8/3) needs two 3s</think> <answer>8 * 3</answer>", True, None, set()),
        ("<answer>8 / (3 - 8 / 3)</answer>", False, "uses numbers not available: [3]", set()),
        ("<answer>3 * 8</answer>", True, None, set()),
        ("<answer>8 + 8 + 3</answer>", False, "expression equals 19, not 24", set()),
        ("the answer is 3*8", False, "no <answer> tag", {"missing_answer"}),
        ("<answer>8+8</answer> no wait <answer>3*8</answer>", True, None, {"multiple_answers"}),
        ("<answer>3 * 8 * 1</answer>", False, "uses numbers not available: [1]", set()),
        ("<answer>import os</answer>", False, "not an arithmetic expression (SyntaxError)", set()),
        ("x" * 5000 + "<answer>3*8</answer>", True, None, {"too_long"}),
    ],
)
def test_grader_on_hand_checked_attempts(domain, attempt, solved, reason, flags):
    verdict = domain.grade({"numbers": [3, 8, 8], "target": 24}, attempt)
    assert (verdict.solved, verdict.reason) == (solved, reason)
    assert {flag for flag, raised in verdict.diagnostics.items() if raised} == flags


@functools.cache
def shared():
    """One domain and its predicates for the fuzz tests (hypothesis reruns a test body many times)."""
    registry = Registry.build()
    domain = registry.domain("countdown", num_contexts=1)
    return domain, registry.validity_predicates(domain)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("Numbers:Target0123456789 ,\n-[]=x")), max_size=80) | st.text(max_size=80))
def test_parse_and_validity_never_raise(text):
    domain, predicates = shared()
    task = make_task("t", domain, domain.contexts()[0], text, "m", predicates)
    assert task.validity.valid or task.validity.reason


@settings(max_examples=2000, deadline=None)
@given(st.text(max_size=60))
def test_grader_never_raises(expression):
    domain, _ = shared()
    verdict = domain.grade({"numbers": [3, 8, 8], "target": 24}, f"<answer>{expression}</answer>")
    assert verdict.solved in (True, False)


@pytest.mark.parametrize(
    ("attempt", "solved"),
    [
        ("<answer>3 * 8</answer>", True),
        ("<answer>3 * 8 = 24", True),  # unclosed: the answer ends at the line, its stated value is dropped
        ("<answer>8 + 8 = 24\nno, 3 * 8", False),
        ("<answer>24</answer>", False),
        ("<answer>\n3 * 8\nthat is 24", True),  # leading blank lines are skipped
    ],
)
def test_direct_answer_prefills_the_tag_and_grades_the_first_line(propel_registry, attempt, solved):
    direct = propel_registry.domain("countdown", direct_answer=True, num_contexts=1)
    prompt = direct.solver_prompt({"numbers": [3, 8, 8], "target": 24})
    assert prompt[-1] == {"role": "assistant", "content": "<answer>"}
    assert direct.grade({"numbers": [3, 8, 8], "target": 24}, attempt).solved is solved
    assert (
        propel_registry.domain("countdown", num_contexts=1).solver_prompt({"numbers": [3], "target": 3})[-1]["role"]
        == "user"
    )


def test_verdicts_are_the_same_graded_in_many_threads():
    domain = Registry.build().domain("countdown")
    puzzles = [example for context in domain.contexts()[:4] for example in context.data["examples"]][:6]
    answers = ["<answer>{a} + {b}</answer>", "<answer>{a} * {b} - {a}</answer>", "no tag", "<answer>1 / 0</answer>"]
    attempts = [
        (puzzle, answer.format(a=puzzle["numbers"][0], b=puzzle["numbers"][1]))
        for puzzle in puzzles
        for answer in answers
    ]
    assert_same_verdicts_concurrently(domain, attempts, threads=8)


def test_self_trainings_clean_checks_read_the_graders_flags(propel_registry):
    """A verified attempt with two answers, or a repeated tag, or over the domain's length fails the
    named check; a clean one passes them all."""
    from propel_core.domain import grade_attempt
    from propel_core.records import Task, Validity

    domain = propel_registry.domain("countdown", max_attempt_chars=80)
    task = Task(
        id="t", domain="countdown", context_id="c", generation="", generator="m",
        payload={"numbers": [3, 5, 2], "target": 16}, validity=Validity.ok(),
    )  # fmt: skip

    def failed(text):
        attempt = grade_attempt(domain, task, text)
        assert attempt.solved, attempt.reason
        return [name for name, passed in domain.clean_checks(attempt) if not passed]

    assert failed("<answer>(3 + 5) * 2</answer>") == []
    assert failed("<answer>(3 + 5) * 2</answer> or <answer>2 * (5 + 3)</answer>") == ["one answer", "no repeated tags"]
    assert failed("<think>a</think><think>b</think><answer>(3 + 5) * 2</answer>") == ["no repeated tags"]
    assert failed("<answer>(3 + 5) * 2</answer>" + " " * 80) == ["within max_attempt_chars"]
