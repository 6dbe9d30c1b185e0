"""Replay (seed 002): earlier high-reward generations put back into later training groups.

Generations are admitted per prompt when their reward clears ``min_reward``, with the comparison
spelled out (``>`` or ``>=``): seed 002 found that this one character decides whether
exact-baseline generations (reward 0.5 there) get replayed. Selection per prompt: ``round_robin``
(admitted generations in turn), ``top_k`` (the best first), ``stable_uniform`` (uniform, seeded) or
``previous_step`` (only what the prompt's most recent admitting step gave).
"""

from __future__ import annotations

import json
import operator
import random
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = ("round_robin", "top_k", "stable_uniform", "previous_step")
COMPARISONS = {">": operator.gt, ">=": operator.ge}


@dataclass
class Entry:
    completion: Any  # what the trainer needs to put it back (token ids and text)
    reward: float
    step: int


@dataclass
class ReplayBuffer:
    strategy: str
    min_reward: float
    comparison: str = ">"
    capacity: int = 8
    seed: int = 0
    entries: dict[str, list[Entry]] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    #: (prompt key, completion token ids) put back into the current batch, so they are not re-admitted
    replayed: set[tuple[str, tuple[int, ...]]] = field(default_factory=set)

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown replay strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.comparison not in COMPARISONS:
            raise ValueError(f"replay comparison must be '>' or '>=', got {self.comparison!r}")
        self.rng = random.Random(self.seed)

    def add(self, key: str, completion: Any, reward: float, step: int) -> bool:
        """Admit a generation if its reward clears the threshold; keeps the best ``capacity`` per prompt."""
        if not COMPARISONS[self.comparison](reward, self.min_reward):
            return False
        kept = self.entries.setdefault(key, [])
        kept.append(Entry(completion, reward, step))
        if len(kept) > self.capacity:  # drop the worst (the oldest among equals)
            kept.remove(min(kept, key=lambda e: (e.reward, e.step)))
        self.admitted += 1
        return True

    def select(self, key: str, n: int) -> list[Any]:
        """Up to ``n`` earlier generations for prompt ``key`` (fewer when the buffer has fewer)."""
        kept = self.entries.get(key, [])
        if not kept or n <= 0:
            return []
        if self.strategy == "top_k":
            chosen = sorted(kept, key=lambda e: (-e.reward, -e.step))[:n]
        elif self.strategy == "stable_uniform":
            chosen = self.rng.sample(kept, min(n, len(kept)))
        elif self.strategy == "previous_step":
            last = max(e.step for e in kept)
            chosen = [e for e in kept if e.step == last][:n]
        else:  # round_robin
            start = self.turns.get(key, 0)
            chosen = [kept[(start + i) % len(kept)] for i in range(min(n, len(kept)))]
            self.turns[key] = (start + len(chosen)) % len(kept)
        return [entry.completion for entry in chosen]


def prompt_key(prompt: Any) -> str:
    """A stable key for a prompt (chat messages or text)."""
    return json.dumps(prompt, sort_keys=True)


def replaying(trainer_class: type, buffer: ReplayBuffer, slots: int) -> type:
    """A subclass of TRL's GRPOTrainer whose generation step swaps the last ``slots`` fresh
    completions of each prompt for replayed ones; the reward function then scores them as usual."""

    class ReplayingTrainer(trainer_class):
        def _generate(self, prompts):
            out = list(super()._generate(prompts))
            _, completion_ids, tool_mask, completions, logprobs = out[:5]
            if tool_mask is not None or logprobs is not None:
                raise ValueError("replay works with plain generation: no tools, no vLLM importance sampling")
            buffer.replayed = set()
            positions: dict[str, list[int]] = {}
            for i, prompt in enumerate(prompts):
                positions.setdefault(prompt_key(prompt), []).append(i)
            for key, indices in positions.items():
                for i, (ids, completion) in zip(reversed(indices), buffer.select(key, slots), strict=False):
                    completion_ids[i], completions[i] = list(ids), completion
                    buffer.replayed.add((key, tuple(ids)))
            return tuple(out)

    return ReplayingTrainer
