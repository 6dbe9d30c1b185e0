"""Context samplers: ``uniform`` (every context equally likely), ``progress`` (the progress-aware
sampling study, sections 3.2-3.3: buckets scored by learning progress and reward variance, mixed
with a coverage prior) and ``trace`` (another sampler's contexts, each with a trace of recently
attempted tasks and their outcomes: the paper's future work, section 8)."""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from propel_core import Context, Label, Task, hookimpl, iter_jsonl


@hookimpl
def register_context_samplers(register):
    for name, sampler in INNER.items():
        register(name, sampler)
    register("trace", TraceSampler)


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


class ProgressSampler:
    """Progress-aware sampling over buckets of contexts.

    Per bucket b, short and long exponential moving averages of the success signal (the mean reward
    of b's contexts in an update; both start at the first observation), learning progress
    LP = max(0, short - long), and I = the mean within-group reward variance of b's last update
    (a group: the rewards of one context in one update). Utility U = lam LP + (1 - lam) I, and
    P(b) = (1 - epsilon) softmax(U / tau) + epsilon prior(b) over the buckets that have data; a
    bucket without data keeps its prior probability. Then, optionally, no bucket above
    ``max_probability`` and the ratio P(b) / P_data(b) clipped to ``density_ratio``, each followed
    by renormalization. ``buckets``: ``domain`` (each context's ``bucket``), ``prompt`` (every
    context its own bucket: the prompt-level variant) or a number of seeded random partitions.
    """

    def __init__(
        self,
        contexts: list[Context],
        seed: int,
        buckets: str | int = "domain",
        prior: str = "empirical",
        alpha_short: float = 0.3,
        alpha_long: float = 0.03,
        lam: float = 0.5,
        epsilon: float = 0.2,
        tau: float = 0.2,
        max_probability: float | None = None,
        density_ratio: tuple[float, float] | list[float] | None = None,
    ):
        if not contexts:
            raise ValueError("the domain offers no contexts to sample from")
        if prior not in ("uniform", "empirical"):
            raise ValueError(f"prior must be 'uniform' or 'empirical', got {prior!r}")
        if not 0 < alpha_long < alpha_short <= 1:
            raise ValueError(f"need 0 < alpha_long < alpha_short <= 1, got {alpha_long}, {alpha_short}")
        if tau <= 0 or not 0 <= epsilon <= 1 or not 0 <= lam <= 1:
            raise ValueError(f"need tau > 0 and epsilon, lam in [0, 1]; got {tau}, {epsilon}, {lam}")
        self.rng = random.Random(seed)
        self.bucket_of = {context.id: _bucket(context, buckets, seed) for context in contexts}
        self.members: dict[str, list[Context]] = defaultdict(list)
        for context in contexts:
            self.members[self.bucket_of[context.id]].append(context)
        self.names = sorted(self.members)
        if max_probability is not None and max_probability * len(self.names) < 1:
            raise ValueError(
                f"max_probability {max_probability} x {len(self.names)} buckets < 1: no distribution fits under the cap"
            )
        self.data = {b: len(self.members[b]) / len(contexts) for b in self.names}
        self.prior = self.data if prior == "empirical" else {b: 1 / len(self.names) for b in self.names}
        self.alpha_short, self.alpha_long, self.lam = alpha_short, alpha_long, lam
        self.epsilon, self.tau = epsilon, tau
        self.max_probability, self.density_ratio = max_probability, density_ratio
        self.short: dict[str, float] = {}
        self.long: dict[str, float] = {}
        self.variance: dict[str, float] = {}
        self.degenerate_rate = 0.0

    def utility(self, bucket: str) -> float:
        progress = max(0.0, self.short[bucket] - self.long[bucket])
        return self.lam * progress + (1 - self.lam) * self.variance[bucket]

    def probabilities(self) -> dict[str, float]:
        seen = [b for b in self.names if b in self.short]
        probabilities = dict(self.prior)
        if seen:
            mass = sum(self.prior[b] for b in seen)  # what the buckets with data share between them
            top = max(self.utility(b) / self.tau for b in seen)
            weights = {b: math.exp(self.utility(b) / self.tau - top) for b in seen}
            total = sum(weights.values())
            for b in seen:
                mixed = (1 - self.epsilon) * weights[b] / total + self.epsilon * self.prior[b] / mass
                probabilities[b] = mass * mixed
        if self.max_probability is not None:
            probabilities = _cap(probabilities, self.max_probability)
        if self.density_ratio is not None:
            low, high = self.density_ratio
            clipped = {b: min(max(p, low * self.data[b]), high * self.data[b]) for b, p in probabilities.items()}
            total = sum(clipped.values())
            probabilities = {b: p / total for b, p in clipped.items()}
        return probabilities

    def sample(self, n: int) -> list[Context]:
        probabilities = self.probabilities()
        chosen = self.rng.choices(self.names, weights=[probabilities[b] for b in self.names], k=n)
        return [self.rng.choice(self.members[b]) for b in chosen]

    def update(self, contexts: list[Context], rewards: list[float]) -> None:
        """One training batch's feedback: per bucket, update the EMAs and the group variance."""
        groups: dict[str, list[float]] = defaultdict(list)
        for context, reward in zip(contexts, rewards, strict=True):
            groups[context.id].append(reward)
        per_bucket: dict[str, list[list[float]]] = defaultdict(list)
        for context_id, group in groups.items():
            per_bucket[self.bucket_of[context_id]].append(group)
        for bucket, bucket_groups in per_bucket.items():
            success = statistics.fmean(r for group in bucket_groups for r in group)
            if bucket not in self.short:
                self.short[bucket] = self.long[bucket] = success
            else:
                self.short[bucket] += self.alpha_short * (success - self.short[bucket])
                self.long[bucket] += self.alpha_long * (success - self.long[bucket])
            self.variance[bucket] = statistics.fmean(statistics.pvariance(group) for group in bucket_groups)
        self.degenerate_rate = sum(len(set(group)) == 1 for group in groups.values()) / max(1, len(groups))

    def diagnostics(self) -> dict:
        """Bucket probabilities next to the empirical prior, and the last update's degenerate-group rate."""
        return {
            "bucket_probabilities": self.probabilities(),
            "data_prior": self.data,
            "buckets_with_data": len(self.short),
            "degenerate_groups": self.degenerate_rate,
        }


INNER = {"uniform": UniformSampler, "progress": ProgressSampler}

#: the trace's groups of tasks, by the solve rate of each one's label against that label's band
GROUPS = ("mastered", "in band", "failed")


def _labels_file(path: str) -> str:
    """The trace option read when the config is: a labels file that is there, not empty, with the tasks
    it labels beside it."""
    labels = Path(path)
    if not labels.is_file():
        raise ValueError(
            f"no labels file {path} (the trace is read from a labels.jsonl with its tasks.jsonl beside it; "
            "a relative path is read from the working directory, as run_dir is)"
        )
    if labels.stat().st_size == 0:
        raise ValueError(f"{path} is empty: no attempted tasks to show the generator (label a run first)")
    if not (labels.parent / "tasks.jsonl").is_file():
        raise ValueError(f"no tasks.jsonl beside {path}: the trace shows each labeled task's text from it")
    return path


LabelsFile = Annotated[str, AfterValidator(_labels_file)]
Positive = Annotated[int, Field(gt=0)]


class TraceSampler:
    """The contexts of ``inner`` (``uniform`` or ``progress``, with ``inner_options``; fed back as it
    is), each with a trace of recently attempted tasks and their outcomes, which the core shows the
    generator at the end of its prompt (``Context.trace``): the generator told what the solver has
    mastered.

    The tasks come from the labels file ``trace`` (a labels.jsonl, its tasks.jsonl beside it: the last
    round's), each graded label in a group by its solve rate against its own band: ``mastered`` (above
    the band), ``in band``, ``failed`` (below it). Each context's trace is ``size`` of them drawn anew
    (seeded, apart from ``inner``'s draws, so the contexts are the ones ``inner`` alone gives) from the
    groups in turn, so every group with tasks is shown; then listed from the highest solve rate down,
    one a line: ``solved 6/8: <the task's text, cut to chars characters>``.
    """

    component_options: ClassVar[dict[str, tuple[str, str]]] = {"inner_options": ("context_samplers", "inner")}

    def __init__(
        self,
        contexts: list[Context],
        seed: int,
        trace: LabelsFile,
        inner: Literal["uniform", "progress"] = "uniform",
        inner_options: dict[str, Any] | None = None,
        size: Positive = 6,
        chars: Positive = 160,
    ):
        self.inner = INNER[inner](contexts, seed, **(inner_options or {}))
        self.groups = _attempted(Path(_labels_file(trace)), chars)
        self.size = size
        self.rng = random.Random(f"{seed}:trace")

    def sample(self, n: int) -> list[Context]:
        return [context.model_copy(update={"trace": self.trace()}) for context in self.inner.sample(n)]

    def trace(self) -> str:
        """``size`` tasks drawn from the groups in turn, from the highest solve rate down, one a line."""
        left = {name: self.rng.sample(entries, len(entries)) for name, entries in self.groups.items()}
        drawn: list[tuple[float, str]] = []
        while len(drawn) < self.size and any(left.values()):
            drawn += [left[name].pop() for name in GROUPS if left[name]][: self.size - len(drawn)]
        return "\n".join(line for _, line in sorted(drawn, key=lambda entry: -entry[0]))

    def update(self, contexts: list[Context], rewards: list[float]) -> None:
        self.inner.update(contexts, rewards)

    def diagnostics(self) -> dict:
        """``inner``'s diagnostics (where it offers any) and how many tasks the trace draws from per group."""
        found = self.inner.diagnostics() if hasattr(self.inner, "diagnostics") else {}
        return found | {"trace_tasks": {name: len(entries) for name, entries in self.groups.items()}}


def _attempted(labels: Path, chars: int) -> dict[str, list[tuple[float, str]]]:
    """Per group, each graded label's solve rate and trace line; refused when none has a task to show."""
    tasks = labels.parent / "tasks.jsonl"
    texts = {task.id: task.text for task in iter_jsonl(tasks, Task) if task.text}
    groups: dict[str, list[tuple[float, str]]] = {name: [] for name in GROUPS}
    for label in iter_jsonl(labels, Label):
        if label.solve_rate is None or label.task_id not in texts:
            continue
        low, high = label.band
        group = "mastered" if label.solve_rate > high else "failed" if label.solve_rate < low else "in band"
        text = texts[label.task_id]
        text = " ".join((" ".join(text) if isinstance(text, list) else text).split())
        text = text if len(text) <= chars else text[: chars - 1] + "…"
        solved = round(label.solve_rate * label.valid_attempts)
        groups[group].append((label.solve_rate, f"solved {solved}/{label.valid_attempts}: {text}"))
    if not any(groups.values()):
        raise ValueError(f"{labels} holds no graded label of a task in {tasks}: no attempted task to show")
    return groups


def _bucket(context: Context, buckets: str | int, seed: int) -> str:
    if buckets == "domain":
        return context.bucket or "all"
    if buckets == "prompt":
        return context.id
    if isinstance(buckets, int) and buckets > 0:
        return f"partition {random.Random(f'{seed}:{context.id}').randrange(buckets)}"
    raise ValueError(f"buckets must be 'domain', 'prompt' or a positive number of random partitions, got {buckets!r}")


def _cap(probabilities: dict[str, float], cap: float) -> dict[str, float]:
    """No bucket above ``cap``: the excess goes to the uncapped buckets in proportion to their mass."""
    result = dict(probabilities)
    capped: set[str] = set()
    while True:
        over = [b for b in result if b not in capped and result[b] > cap + 1e-12]
        if not over:
            return result
        capped.update(over)
        free = [b for b in result if b not in capped]
        excess = sum(result[b] - cap for b in over)
        for b in over:
            result[b] = cap
        free_mass = sum(result[b] for b in free)
        for b in free:
            result[b] += excess * (result[b] / free_mass if free_mass else 1 / len(free))
