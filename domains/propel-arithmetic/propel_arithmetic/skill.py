"""``arithmetic_skill``: a simulated arithmetic solver whose skill is a known function of the task.

A control, not a model: it reads the exercise from the arithmetic domain's solver prompt, and each
attempt answers correctly with probability

    p = 0.95 x 0.8 ** (extra digits) x 0.55 ** (multiplications and divisions) x 0.7 ** (operations - 1)

where "extra digits" counts every digit of an operand beyond its first ("3 + 7": 0, "23 * 45": 2).
So "3 + 7" is solved 95% of the time (8/8 most often, out of the 1..3-of-8 band), "23 + 4" 76%,
"7 * 8" 52%, "23 * 45" 33% (in the 1..3-of-8 band 70% of the time) and "23 * 45 * 12" 10%. A wrong
attempt answers a nearby wrong number. Attempts are drawn from the call's seed, so a rerun gives the
same answers.

It exists to validate the PROPEL pipeline where the embedded 135M solver's labels carry little
difficulty signal (benchmarks/solver_signal.py measures both): with this solver the labels depend on
what the task says, in a way the reference model can read. It says nothing about the paper's claim
for real solvers. Select it with ``solver: {backend: arithmetic_skill}``.
"""

from __future__ import annotations

import random
import re

from propel_core import HiddenStates, ModelConfig, Prompt, PropelError, Sampling, as_messages

EXERCISE = re.compile(r"Compute (.+)\. Reply with the number only\.", re.DOTALL)
BASE, PER_EXTRA_DIGIT, PER_PRODUCT, PER_EXTRA_OPERATION = 0.95, 0.8, 0.55, 0.7


def success_probability(expression: str) -> float:
    """The chance one attempt at ``expression`` is right (the formula in the module docstring)."""
    from propel_arithmetic.plugin import INTEGER, OPERATOR

    operands = INTEGER.findall(expression)
    operators = OPERATOR.findall(expression)
    extra_digits = sum(len(operand.lstrip("0") or "0") - 1 for operand in operands)
    products = sum(op in "*/" for op in operators)
    return (
        BASE * PER_EXTRA_DIGIT**extra_digits * PER_PRODUCT**products * PER_EXTRA_OPERATION ** max(len(operators) - 1, 0)
    )


class ArithmeticSkill:
    """The model backend: ``generate`` only; there are no hidden states to read."""

    def __init__(self, model: ModelConfig):
        self.model_id = "arithmetic-skill (simulated solver)"

    def generate(
        self, prompts: list[Prompt], sampling: Sampling, n: int = 1, seed: int | list[int] | None = None
    ) -> list[list[str]]:
        seeds = seed if isinstance(seed, list) else [seed] * len(prompts)
        return [[self._attempt(prompt, s, r) for r in range(n)] for prompt, s in zip(prompts, seeds, strict=True)]

    def _attempt(self, prompt: Prompt, seed: int | None, index: int) -> str:
        from propel_arithmetic.plugin import value_of

        # the task is the last question; worked exercises (the domain's solver_shots) come before it
        question = [message for message in as_messages(prompt) if message["role"] == "user"][-1]["content"]
        match = EXERCISE.fullmatch(question.strip())
        if match is None:
            raise PropelError("the arithmetic_skill solver answers only the arithmetic domain's solver prompt")
        expression = match.group(1)
        rng = random.Random(f"{seed}/{index}/{expression}")
        value = value_of(expression)
        value = int(value) if value == int(value) else float(value)
        if rng.random() < success_probability(expression):
            return f" {value}"
        return f" {value + rng.choice([-10, -2, -1, 1, 2, 10])}"

    def hidden_states(self, texts: list[str], layers: list[int], max_length: int) -> HiddenStates:
        raise PropelError("the arithmetic_skill solver is simulated and has no hidden states; read them from a model")
