"""The arithmetic domain: the generator writes one exercise, the solver answers with a number.

Small solvers land such exercises anywhere between always and never solved (single-digit sums
almost always, two-digit products almost never), so the target band is reachable even for the
embedded 135M model: this is the quick-start demo's domain. Expressions are read with the countdown
package's exact evaluator (``ast``, never ``eval``).
"""

from __future__ import annotations

import random
import re
from typing import Any

from propel_core import Context, Domain, Messages, ParseError, Task, Validity, Verdict, hookimpl
from propel_countdown.arithmetic import ExpressionError, evaluate


@hookimpl
def register_domains(register):
    register("arithmetic", Arithmetic)


@hookimpl
def register_model_backends(register):
    from propel_arithmetic.skill import ArithmeticSkill

    register("arithmetic_skill", ArithmeticSkill)


@hookimpl
def register_validity_predicates(register):
    register("arithmetic_well_formed", check_well_formed)


COMPUTE = re.compile(r"compute\s*:?[ \t]*([^\n]*)", re.IGNORECASE)
INTEGER = re.compile(r"\d+")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATOR = re.compile(r"[-+*/]")
OPERATOR_NAMES = {"+": "addition", "-": "subtraction", "*": "multiplication", "/": "division"}


class Arithmetic(Domain):
    """Exercises of 1..``max_operators`` operations on integers up to ``max_operand``."""

    validity_predicates = ("arithmetic_well_formed",)
    workflow_markers = ("compute line", "parsed", "evaluates", "within limits")
    stop_strings = ("\n",)  # an exercise is one line: what the model adds after it is not the task

    def __init__(
        self,
        max_operators: int = 2,
        max_operand: int = 100,
        max_value: int = 10_000,
        num_contexts: int = 48,
        seed: int = 7,
        solver_shots: int = 0,
    ):
        if not isinstance(solver_shots, int) or isinstance(solver_shots, bool):
            raise ValueError(f"solver_shots must be a whole number, got {solver_shots!r}")
        if max_operators < 1 or max_operand < 2 or max_value < 1 or solver_shots < 0:
            raise ValueError(
                "need max_operators >= 1, max_operand >= 2, max_value >= 1 and solver_shots >= 0, "
                f"got {max_operators}, {max_operand}, {max_value}, {solver_shots}"
            )
        self.max_operators, self.max_operand, self.max_value = max_operators, max_operand, max_value
        self._contexts = _make_contexts(num_contexts, seed, self)
        self.solver_shots = solver_shots
        shots = _make_shots(solver_shots + 1, seed, self) if solver_shots else []
        self._shots = [(_shape(shot), shot, f"Answer: {value_of(shot)}") for shot in shots]  # made once

    def contexts(self) -> list[Context]:
        return self._contexts

    def generator_prompt(self, context: Context) -> Messages:
        examples = "\n".join(f"Compute: {example}" for example in context.data["examples"])
        return [
            {
                "role": "user",
                "content": (
                    "You write arithmetic exercises for a student: whole numbers, +, -, * and /, and "
                    f"at most {self.max_operators} operations. Two examples:\n\n{examples}\n\n"
                    "Write one new exercise in exactly this format and nothing else:\nCompute: <expression>"
                ),
            },
            {"role": "assistant", "content": "Compute:"},
        ]

    def parse(self, generation: str) -> dict[str, Any]:
        match = COMPUTE.search(generation)
        if match is None:
            raise ParseError("no 'Compute:' line")
        expression = match.group(1).split("=", 1)[0].strip().rstrip("?. ")  # "6 / 6 = 1" gives its answer away
        if not expression:
            raise ParseError("the 'Compute:' line is empty")
        return {"expression": expression}

    def render(self, payload: dict[str, Any]) -> str:
        return f"Compute: {payload['expression']}"

    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        """Zero-shot by default; ``solver_shots`` worked exercises go first, as earlier turns (the spare
        one stands in for a shot that is the task itself, in any order of its operands)."""
        task = _shape(payload["expression"]) if self._shots else None  # zero-shot reads nothing of the task
        turns = [(shot, answer) for shape, shot, answer in self._shots if shape != task][: self.solver_shots]
        messages: Messages = []
        for expression, answer in [*turns, (payload["expression"], "Answer:")]:
            messages.append({"role": "user", "content": f"Compute {expression}. Reply with the number only."})
            messages.append({"role": "assistant", "content": answer})
        return messages

    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        """The answer is the last number on the attempt's first line ("12 + 7 = 19" answers 19)."""
        first_line = attempt.removeprefix("Answer:").strip().split("\n", 1)[0]
        numbers = NUMBER.findall(first_line)
        diagnostics = {"missing_answer": not numbers}
        if not numbers:
            return Verdict(False, "no number on the answer line", diagnostics)
        value = value_of(payload["expression"])
        answer = float(numbers[-1])
        if answer != value:
            return Verdict(False, f"answered {numbers[-1]}, the value is {value}", diagnostics)
        return Verdict(True, None, diagnostics)

    def topic(self, payload: dict[str, Any]) -> str:
        operators = sorted({OPERATOR_NAMES[op] for op in OPERATOR.findall(payload["expression"])})
        return " and ".join(operators) or "a bare number"

    def markers_reached(self, generation: str) -> list[str]:
        if COMPUTE.search(generation) is None:
            return []
        try:
            expression = self.parse(generation)["expression"]
        except ParseError:
            return ["compute line"]
        reached = ["compute line", "parsed"]
        try:
            value_of(expression)
        except ExpressionError:
            return reached
        return [*reached, "evaluates", *(["within limits"] if problem(expression, self) is None else [])]


def value_of(expression: str):
    """The exact value of an expression over any integers (each literal is allowed once as written)."""
    return evaluate(expression, [int(n) for n in INTEGER.findall(expression)])


def check_well_formed(task: Task, domain: Arithmetic) -> Validity:
    reason = problem(task.payload["expression"], domain)
    return Validity.ok() if reason is None else Validity.reject(reason)


def problem(expression: str, domain: Arithmetic) -> str | None:
    """What keeps ``expression`` from being a well-formed exercise; None when nothing does."""
    try:
        value = value_of(expression)
    except ExpressionError as exc:
        return str(exc)
    operators = len(OPERATOR.findall(expression))
    if not 1 <= operators <= domain.max_operators:
        return f"needs 1-{domain.max_operators} operations, has {operators}"
    if any(int(n) > domain.max_operand for n in INTEGER.findall(expression)):
        return f"operands must be at most {domain.max_operand}"
    if value != int(value) or abs(value) > domain.max_value:
        return f"the value must be a whole number of at most {domain.max_value} in size"
    return None


def _make_contexts(count: int, seed: int, domain: Arithmetic) -> list[Context]:
    """Each context shows two exercises of one shape: operation count and operand size."""
    rng = random.Random(seed)
    contexts = []
    for index in range(count):
        operations = rng.randint(1, domain.max_operators)
        digits = rng.choice((1, 2)) if domain.max_operand >= 10 else 1
        examples = [_exercise(rng, operations, digits, domain) for _ in range(2)]
        if None in examples:
            raise ValueError(
                f"no well-formed exercise of {operations} operation(s) on {digits}-digit operands fits "
                f"max_operand={domain.max_operand} and max_value={domain.max_value}"
            )
        bucket = f"{operations} operation{'s' * (operations > 1)}, {digits}-digit"
        contexts.append(Context(id=f"arithmetic-{index:03d}", data={"examples": examples}, bucket=bucket))
    return contexts


def _make_shots(count: int, seed: int, domain: Arithmetic) -> list[str]:
    """The solver prompt's worked exercises: shapes in turn (one operation on 1-digit, then 2-digit
    operands, then two operations, where allowed), drawn from their own seed, none of them a context's
    example in any order of its operands."""
    rng = random.Random(f"shots-{seed}")
    shapes = [shape for shape in [(1, 1), (1, 2), (2, 1)] if shape[0] <= domain.max_operators]
    taken = {_shape(example) for context in domain.contexts() for example in context.data["examples"]}
    shots: list[str] = []
    misses = 0
    while len(shots) < count and misses < 1000:  # few exercises of a shape fit a small operand range
        exercise = _exercise(rng, *shapes[len(shots) % len(shapes)], domain)
        shape = exercise and _shape(exercise)
        if exercise is None or shape in taken:
            misses += 1
            continue
        shots.append(exercise)
        taken.add(shape)
        misses = 0
    if len(shots) < count:
        raise ValueError(
            f"solver_shots={count - 1}: 1,000 draws in a row found no new exercise within max_operators="
            f"{domain.max_operators}, max_operand={domain.max_operand} and max_value={domain.max_value} "
            f"unlike the contexts' examples, after {len(shots)} of the {count} needed (the asked number "
            "and a spare); ask for fewer"
        )
    return shots


def _shape(expression: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """An exercise's operands and operators, each sorted: ``8 * 9`` and ``9 * 8`` are one exercise."""
    return tuple(sorted(int(n) for n in INTEGER.findall(expression))), tuple(sorted(OPERATOR.findall(expression)))


def _exercise(rng: random.Random, operations: int, digits: int, domain: Arithmetic) -> str | None:
    """A well-formed exercise: a division only where it comes out whole (None when 10,000 draws found
    none: limits no exercise of this shape meets)."""
    high = min(domain.max_operand, 10**digits - 1)
    for _ in range(10_000):
        parts = [str(rng.randint(2, high))]
        for _ in range(operations):
            parts += [rng.choice("+-*/"), str(rng.randint(2, high))]
        expression = " ".join(parts)
        if problem(expression, domain) is None:
            return expression
    return None
