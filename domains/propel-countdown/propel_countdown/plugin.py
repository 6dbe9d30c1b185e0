"""The countdown domain and its validity predicates, registered with propel."""

from __future__ import annotations

import random
import re
from typing import Any

from propel_core import Context, Domain, Messages, ParseError, SolverAttempt, Task, Validity, Verdict, hookimpl
from propel_countdown.arithmetic import ExpressionError, evaluate, solvable


@hookimpl
def register_domains(register):
    register("countdown", Countdown)


@hookimpl
def register_validity_predicates(register):
    register("countdown_rules", check_rules)
    register("countdown_solvable", check_solvable)


NUMBERS_LINE = re.compile(r"numbers\s*[:=]\s*\[?([^\n\]]*)", re.IGNORECASE)
TARGET_LINE = re.compile(r"target\s*[:=][ \t]*([^\n]*)", re.IGNORECASE)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class Countdown(Domain):
    """Puzzles of 3-6 numbers and a target; a solver answers with an expression in <answer> tags.

    An answer is integers from the puzzle (each at most as often as given), + - * /, parentheses, and
    a unary - or + before any number or parenthesized part (``-100 + x`` grades as ``x - 100``).
    Anything else is refused: powers, functions, numbers not given or reused, digits run together.
    """

    validity_predicates = ("countdown_rules", "countdown_solvable")
    #: the validity funnel, step by step: partial credit for how far an invalid puzzle got
    workflow_markers = ("target line", "numbers line", "parsed", "within the rules", "solvable")

    def __init__(
        self,
        min_numbers: int = 3,
        max_numbers: int = 6,
        max_number: int = 100,
        max_target: int = 1000,
        num_contexts: int = 64,
        max_attempt_chars: int = 4000,
        direct_answer: bool = False,
        seed: int = 1234,
    ):
        if not 2 <= min_numbers <= max_numbers <= 6:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 6, got {min_numbers}..{max_numbers}")
        self.min_numbers, self.max_numbers = min_numbers, max_numbers
        self.max_number, self.max_target = max_number, max_target
        self.max_attempt_chars = max_attempt_chars
        self.direct_answer = direct_answer
        self._contexts = _make_contexts(num_contexts, seed, self)

    def contexts(self) -> list[Context]:
        return self._contexts

    def generator_prompt(self, context: Context) -> Messages:
        examples = "\n\n".join(self.render(example) for example in context.data["examples"])
        count = context.data["count"]
        return [
            {
                "role": "user",
                "content": (
                    "You write Countdown puzzles. A puzzle is a list of numbers and a target number. "
                    "Whoever solves it must reach the target by combining some of the numbers with "
                    "+, -, * and /, using each number at most once.\n\n"
                    f"Two example puzzles:\n\n{examples}\n\n"
                    f"Write one new puzzle with {count} numbers between 1 and {self.max_number}, in exactly "
                    "this format and nothing else:\nTarget: <number>\nNumbers: <comma-separated numbers>"
                ),
            },
            {"role": "assistant", "content": "Target:"},
        ]

    def parse(self, generation: str) -> dict[str, Any]:
        numbers_match = NUMBERS_LINE.search(generation)
        if numbers_match is None:
            raise ParseError("no 'Numbers:' line")
        target_match = TARGET_LINE.search(generation)
        if target_match is None:
            raise ParseError("no 'Target:' line")
        items = [item for item in re.split(r"[,\s]+", numbers_match.group(1).strip()) if item]
        if not items:
            raise ParseError("the 'Numbers:' line is empty")
        if not all(re.fullmatch(r"-?\d{1,9}", item) for item in items):
            raise ParseError("the numbers are not all integers")
        target = target_match.group(1).strip()
        if not re.fullmatch(r"-?\d{1,9}", target):
            raise ParseError("the target is not an integer")
        return {"numbers": [int(item) for item in items], "target": int(target)}

    def render(self, payload: dict[str, Any]) -> str:
        return f"Target: {payload['target']}\nNumbers: {', '.join(map(str, payload['numbers']))}"

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        numbers = ", ".join(map(str, payload["numbers"]))
        task = (
            f"Using the numbers {numbers}, write an arithmetic expression that equals {payload['target']}. "
            "You may use +, -, *, / and parentheses, and each number at most once. "
        )
        if self.direct_answer:  # the attempt starts inside the answer tag: no room to think
            return [
                {"role": "user", "content": task + "Give only the expression inside <answer> </answer> tags."},
                {"role": "assistant", "content": "<answer>"},
            ]
        return [
            {
                "role": "user",
                "content": task + "Think it through, then give only the final expression inside <answer> </answer> "
                "tags, for example <answer>(3 + 5) * 2</answer>.",
            }
        ]

    def clean_checks(self, attempt: SolverAttempt) -> list[tuple[str, bool]]:
        """One answer, within the domain's length, each tag once (the progress-aware sampling study's
        clean filter)."""
        flags, text = attempt.diagnostics, attempt.text
        return [
            ("one answer", not (flags.get("multiple_answers") or flags.get("missing_answer"))),
            ("within max_attempt_chars", not flags.get("too_long")),
            ("no repeated tags", text.count("<think>") <= 1 and text.count("<answer>") <= 1),
        ]

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        answers = ANSWER.findall(attempt)
        if not answers and self.direct_answer and attempt.startswith("<answer>"):
            answers = [attempt.removeprefix("<answer>").strip().split("\n", 1)[0]]  # an unclosed tag ends at the line
        diagnostics = {
            "missing_answer": not answers,
            "multiple_answers": len(answers) > 1,
            "too_long": len(attempt) > self.max_attempt_chars,
        }
        if not answers:
            return Verdict(False, "no <answer> tag", diagnostics)
        try:
            expression = answers[-1].split("=", 1)[0]  # "3 + 5 = 8" states its value
            value = evaluate(expression, payload["numbers"], signs=True)
        except ExpressionError as exc:
            return Verdict(False, str(exc), diagnostics)
        if value != payload["target"]:
            return Verdict(False, f"expression equals {value}, not {payload['target']}", diagnostics)
        return Verdict(True, None, diagnostics)

    def markers_reached(self, generation: str) -> list[str]:
        reached = [
            name
            for name, line in (("target line", TARGET_LINE), ("numbers line", NUMBERS_LINE))
            if line.search(generation)
        ]
        try:
            task = Task(
                id="",
                domain=self.name,
                context_id="",
                generation=generation,
                generator="",
                payload=self.parse(generation),
                validity=Validity.ok(),
            )
        except ParseError:
            return reached
        reached.append("parsed")
        if check_rules(task, self).valid:
            reached.append("within the rules")
            if check_solvable(task, self).valid:
                reached.append("solvable")
        return reached

    def topic(self, payload: dict[str, Any]) -> str:
        magnitude = len(str(abs(payload["target"])))
        return f"{len(payload['numbers'])} numbers, {magnitude}-digit target"


def check_rules(task: Task, domain: Countdown) -> Validity:
    numbers, target = task.payload["numbers"], task.payload["target"]
    if not domain.min_numbers <= len(numbers) <= domain.max_numbers:
        return Validity.reject(f"needs {domain.min_numbers}-{domain.max_numbers} numbers")
    if not all(1 <= n <= domain.max_number for n in numbers):
        return Validity.reject(f"numbers must lie in 1..{domain.max_number}")
    if not 1 <= target <= domain.max_target:
        return Validity.reject(f"target must lie in 1..{domain.max_target}")
    if target in numbers:
        return Validity.reject("target is one of the numbers (trivial)")
    return Validity.ok()


def check_solvable(task: Task, domain: Countdown) -> Validity:
    if solvable(tuple(sorted(task.payload["numbers"])), task.payload["target"]):
        return Validity.ok()
    return Validity.reject("target unreachable from the numbers")


def _make_contexts(count: int, seed: int, domain: Countdown) -> list[Context]:
    """Contexts ask for a puzzle of a given size and show two solvable example puzzles of that size."""
    rng = random.Random(seed)
    contexts = []
    for index in range(count):
        size = rng.randint(domain.min_numbers, domain.max_numbers)
        examples = [_example_puzzle(rng, size, domain) for _ in range(2)]
        contexts.append(
            Context(id=f"countdown-{index:03d}", data={"count": size, "examples": examples}, bucket=f"{size} numbers")
        )
    return contexts


def _example_puzzle(rng: random.Random, size: int, domain: Countdown) -> dict[str, Any]:
    """A solvable puzzle: the target is the value of a random expression over the numbers."""
    while True:
        numbers = [rng.randint(1, min(domain.max_number, 25 if i % 2 else domain.max_number)) for i in range(size)]
        values = rng.sample(numbers, k=rng.randint(2, size))
        total = values[0]
        for value in values[1:]:
            op = rng.choice("+-*")
            total = total + value if op == "+" else total - value if op == "-" else total * value
        if 10 <= total <= domain.max_target and total not in numbers:
            return {"numbers": numbers, "target": total}
