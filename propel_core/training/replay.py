"""Replay (the ML-engineering RL study): earlier high-reward generations put back into later training groups.

Generations are admitted per prompt when their reward clears ``min_reward``, with the comparison
spelled out (``>`` or ``>=``): the ML-engineering RL study found that this one character decides whether
exact-baseline generations (reward 0.5 there) get replayed. Selection per prompt: ``round_robin``
(admitted generations in turn), ``top_k`` (the best first), ``stable_uniform`` (uniform, seeded) or
``previous_step`` (only what the prompt's most recent admitting step gave).
"""

from __future__ import annotations

import inspect
import json
import operator
import random
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from propel_core.errors import PropelError

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

    @classmethod
    def of(cls, replay, seed: int) -> ReplayBuffer | None:
        """The buffer a ``ReplayConfig`` (``train.replay``, ``solve_train.replay``) asks for; None for
        strategy ``none``."""
        if replay.strategy == "none":
            return None
        return cls(replay.strategy, replay.min_reward, replay.comparison, replay.capacity, seed)

    def offer(self, step: int, prompts, completions, completion_ids, rewards: list[float]) -> int:
        """Offer a scored batch's fresh generations (replays put back this step are skipped); the
        number of replays in the batch."""
        replayed = 0
        for prompt, completion, ids, reward in zip(prompts, completions, completion_ids, rewards, strict=True):
            key = prompt_key(prompt)
            if (key, tuple(ids)) in self.replayed:
                replayed += 1
            else:
                self.add(key, (list(ids), completion), reward, step)
        return replayed

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


#: The TRL releases whose private ``GRPOTrainer._generate(prompts)`` returns what ``replaying`` unpacks:
#: ``(prompt_ids, completion_ids, tool_mask, completions, logprobs, ...)``. TRL 1.0 to 1.8 had
#: ``total_completion_tokens`` where ``logprobs`` is now (dropped in 1.9, huggingface/trl#6439). TRL offers
#: no public hook that swaps completions before rewards (``rollout_func`` is experimental and replaces
#: generation whole), hence the override. Keep in step with the ``trl`` pin in pyproject.toml.
TRL_SUPPORTED = ">=1.9,<1.17"
GENERATE_FIELDS = ("prompt_ids", "completion_ids", "tool_mask", "completions", "logprobs")


def trl_version() -> str:
    try:
        return version("trl")
    except PackageNotFoundError:
        return "(not installed)"


def trl_shape_error(what: str) -> PropelError:
    """One line naming the TRL version and what changed in the private method replay overrides."""
    return PropelError(
        f"train.replay overrides TRL's private GRPOTrainer._generate as in trl{TRL_SUPPORTED}, but trl "
        f"{trl_version()} {what}; install trl{TRL_SUPPORTED} or set train.replay.strategy: none"
    )


def check_generate_signature(trainer_class: type) -> None:
    """Fail at class creation when ``trainer_class`` has no ``_generate(self, prompts)``."""
    generate = inspect.getattr_static(trainer_class, "_generate", None)
    if not inspect.isfunction(generate):
        raise trl_shape_error(f"{trainer_class.__name__} has no method _generate")
    parameters = list(inspect.signature(generate).parameters)
    if parameters != ["self", "prompts"]:
        raise trl_shape_error(f"has _generate({', '.join(parameters[1:])}) instead of _generate(prompts)")


def unpack_generated(out: Any, count: int) -> tuple[list, list, list | None, list, list | None]:
    """The first five fields of ``_generate``'s return, checked: a field of the wrong type means TRL
    reordered or replaced it, and swapping completions into it would corrupt training silently."""
    if not isinstance(out, tuple) or len(out) < len(GENERATE_FIELDS):
        shape = f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__
        raise trl_shape_error(f"returns {shape} from _generate, not a tuple of ({', '.join(GENERATE_FIELDS)}, ...)")
    fields = out[: len(GENERATE_FIELDS)]
    for index, (name, value) in enumerate(zip(GENERATE_FIELDS, fields, strict=True)):
        optional = name in ("tool_mask", "logprobs")
        if (value is None and optional) or (isinstance(value, list) and len(value) == count):
            continue
        found = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        expected = f"{'None or ' if optional else ''}a list of {count} (one per prompt)"
        raise trl_shape_error(f"returns {found} as _generate's field {index} ({name}), expected {expected}")
    completion_ids = fields[1]
    if not all(isinstance(ids, list) and all(isinstance(t, int) for t in ids) for ids in completion_ids):
        raise trl_shape_error("returns completion_ids (_generate's field 1) that are not lists of int token ids")
    return fields


def replaying(trainer_class: type, buffer: ReplayBuffer, slots: int) -> type:
    """A subclass of TRL's GRPOTrainer whose generation step swaps the last ``slots`` fresh
    completions of each prompt for replayed ones; the reward function then scores them as usual.

    It overrides TRL's private ``_generate`` (see ``TRL_SUPPORTED``): a different signature fails
    here, a different return shape on the first generation step, each with one line naming the cause."""
    check_generate_signature(trainer_class)

    class ReplayingTrainer(trainer_class):
        def _generate(self, prompts):
            out = super()._generate(prompts)
            _, completion_ids, tool_mask, completions, logprobs = unpack_generated(out, len(prompts))
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
            return out

    return ReplayingTrainer
