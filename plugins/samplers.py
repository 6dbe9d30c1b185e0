"""The ``uniform`` context sampler: every context equally likely, reproducible from the seed."""

from __future__ import annotations

import random

from propel_core import hookimpl
from propel_core.records import Context


@hookimpl
def register_context_samplers(register):
    register("uniform", UniformSampler)


class UniformSampler:
    def __init__(self, contexts: list[Context], seed: int):
        if not contexts:
            raise ValueError("the domain offers no contexts to sample from")
        self.contexts = contexts
        self.rng = random.Random(seed)

    def sample(self, n: int) -> list[Context]:
        return [self.rng.choice(self.contexts) for _ in range(n)]

    def update(self, contexts: list[Context], rewards: list[float]) -> None:
        """Uniform sampling ignores feedback."""
