"""The contracts of the component kinds that are plain objects or callables.

``Domain`` (:mod:`propel_core.domain`) and ``ModelBackend`` (:mod:`propel_core.backend`) have their own
modules; every other kind a plugin contributes is typed here, with the jobs an executor runs
(``Attempt``, ``Episode``, ``Grading``) and what it runs them with (``JobRunner``), so this module
depends on the records alone, never on the core that implements it. The registry's accessors
(``Registry.context_sampler``, ``reward_rule``, ``sandbox``, ``executor``) build a component and check
it against its contract, so a plugin that returns the wrong thing fails with one line naming the
plugin and what is missing, not deep inside a stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from propel_core.records import Context, Task

if TYPE_CHECKING:
    import torch

#: the probe scores the core computes for a reward rule: the main probe's ``logit`` and ``probability``,
#: every probe's logit (``ensemble_logits``) and the second probe's (``auxiliary_logit``, co-evolution)
PROBE_SCORES = frozenset({"logit", "probability", "ensemble_logits", "auxiliary_logit"})

#: ``register_poolers``: ``pooler(hidden[B, T, D], mask[B, T]) -> Tensor[B, D']``; padding never reaches it
Pooler = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]

#: ``register_probe_architectures``: ``factory(input_dim) -> torch.nn.Module`` mapping [B, input_dim] to logits [B]
ProbeArchitecture = Callable[[int], "torch.nn.Module"]


@runtime_checkable
class ContextSampler(Protocol):
    """Which contexts the generator sees next (``register_context_samplers``)."""

    def sample(self, n: int) -> list[Context]:
        """``n`` contexts, drawn from the sampler's seeded generator."""

    def update(self, contexts: list[Context], rewards: list[float]) -> None:
        """The rewards those contexts just earned (a no-op for samplers that ignore feedback)."""


@runtime_checkable
class RewardRule(Protocol):
    """How validity and scores combine into the RL reward (``register_reward_rules``)."""

    #: the score names the rule reads, from PROBE_SCORES and ``solver_utility`` (the real utility of
    #: K live solver attempts), ``markers`` (workflow markers reached) and ``verifier_score`` (the
    #: domain's own score of a valid task); the scorer computes only those. A rule registered
    #: without it reads the probe's scores.
    needs: frozenset[str]

    def __call__(self, task: Task, scores: Mapping[str, Any]) -> float:
        """One finite reward; a missing or non-finite score raises ``RewardError``."""


class ReadsProbe:
    """A rule registered without ``needs``: it reads the probe scores."""

    needs = PROBE_SCORES

    def __init__(self, rule: Callable[[Task, Mapping[str, Any]], float]):
        self.rule = rule

    def __call__(self, task: Task, scores: Mapping[str, Any]) -> float:
        return self.rule(task, scores)


def reads_probe(rule: RewardRule) -> bool:
    """Whether the rule reads any probe score (and so needs a probe bundle)."""
    return bool(rule.needs & PROBE_SCORES)


#: the probe scores that are logits: a rule reading one pays a valid task on the logit's scale
LOGIT_SCORES = frozenset({"logit", "ensemble_logits", "auxiliary_logit"})


def paid_in_logits(rule: RewardRule) -> bool:
    """Whether the rule pays valid tasks a probe logit, so that its r_bad and overflow reward are
    calibrated below the probe's logits (``RewardConfig.settled``); a rule registered without ``needs``
    counts as one."""
    return bool(rule.needs & LOGIT_SCORES)


#: the statuses a sandboxed run ends with; ``sandbox_error`` alone is the harness's failure (the grader
#: makes the attempt ungradable), every other one is the program's doing
SANDBOX_STATUSES = (
    "ok", "error", "timeout", "oom", "output_limit", "disk_limit", "crashed", "no_result", "sandbox_error",
)  # fmt: skip


class Outcome(Protocol):
    """What a sandboxed run returns.

    **Time.** A run's time limit is judged by what the run itself used, never by the wall clock
    alone, so that a verdict is the same on an idle machine and on a busy one (``propel_core.clock``):
    ``timeout`` means its processes (children and exited ones included) used more CPU time than the
    limit, or more *own time* than the limit (the wall clock less the time its threads waited for a
    CPU: sleeping, blocking, a deadlock). A run still going when the wall clock reaches the sandbox's
    backstop (several times the limit) had used neither: it queued for a CPU, so the machine was too
    busy to judge it, and it ends ``sandbox_error`` with a ``detail`` starting ``overloaded``, which
    graders make ungradable and the stages run again (``propel_core.execution``). A third-party
    sandbox reports ``cpu_seconds`` and ``duration`` as it measured them and follows the same rule;
    one that can only judge by the wall clock says so in its docs, since its verdicts move with load.
    """

    #: one of ``SANDBOX_STATUSES``
    status: str
    #: the JSON the program wrote to ``result.json``, parsed as data (None when it wrote none)
    result: Any
    stdout: str
    stderr: str
    #: why the status (the limit it went over, the harness's failure), or None for ``ok``
    detail: str | None
    #: seconds of CPU the run's processes used, children and exited ones included
    cpu_seconds: float
    #: seconds of wall clock from start to end
    duration: float


@runtime_checkable
class Workspace(Protocol):
    """A private copy of a checkout; everything in it is removed on ``close``."""

    def run(self, command: str, time_limit: float | None = None) -> Outcome: ...

    def read(self, path: str) -> bytes: ...

    def write(self, path: str, data: bytes) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """Runs untrusted code (everything a model writes) under time, memory, process and output limits
    (``register_sandboxes``); what the code-executing domains (azr) use."""

    def run_python(
        self, files: dict[str, str], main: str, hash_seed: int = 0, time_limit: float | None = None
    ) -> Outcome:
        """Write ``files`` into a fresh workdir and run ``main`` there with Python."""


@runtime_checkable
class RepositorySandbox(Protocol):
    """A sandbox that gives whole checkouts to run commands in (``register_sandboxes``); what the SWE
    domain uses. The local sandbox is both kinds; the docker sandbox is this one."""

    def workspace(self, path: Path | None = None, image: str | None = None, workdir: str = "/testbed") -> Workspace:
        """A fresh copy of the checkout at ``path`` (or of an image), seen at ``workdir``."""


@dataclass(frozen=True, eq=False)
class Attempt:
    """Solver attempt ``index`` at ``task``."""

    task: Task
    index: int
    seed: int


@dataclass(frozen=True, eq=False)
class Episode:
    """One generation: the generator's episode on ``context``, to become task ``task_id``."""

    task_id: str
    context: Context
    seed: int


@dataclass(frozen=True, eq=False)
class Grading:
    """Grading an attempt already written (``text``, by a policy in training) at ``task``: no model
    runs, only the domain's grader, which may be the expensive part (a sandboxed execution)."""

    task: Task
    text: str


Job = Attempt | Episode | Grading


@runtime_checkable
class JobRunner(Protocol):
    """What an executor runs jobs with: the core's ``propel_core.execution.Worker`` (the domain and a
    model with its sampling), picklable for an executor that ships it to other processes."""

    def key(self) -> str:
        """The same for every worker that runs jobs the same way (a process may keep one per key)."""

    def generate(self, prompts: list[Any], sampling: Any, n: int = 1, seed: int | None = None) -> list[list[str]]:
        """The model's completions (``n`` per prompt), for an executor that batches turns of jobs."""

    def run(self, job: Job, generate: Callable[..., list[list[str]]] | None = None) -> Any:
        """Run one job (with ``generate`` in place of the model's own, e.g. a batcher of many jobs'
        turns): a ``SolverAttempt`` for an ``Attempt`` or a ``Grading``, a ``Task`` for an ``Episode``."""


@runtime_checkable
class Executor(Protocol):
    """Where solver attempts and generator episodes run (``register_executors``)."""

    #: jobs started and not yet finished, for progress displays
    in_flight: int

    def run(self, worker: JobRunner, jobs: list[Job]) -> Iterator[tuple[Job, Any]]:
        """Run every job with ``worker`` and yield ``(job, result)`` as each one finishes, in any order.
        Leaving the iterator early (an error, Ctrl-C) stops the jobs still running or queued."""
