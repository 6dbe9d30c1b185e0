"""The interface every task domain implements, and how the core turns a generation into a Task."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from propel_core.records import Context, SolverAttempt, Task, Validity

if TYPE_CHECKING:
    from propel_core.plugins import Registry

Messages = list[dict[str, str]]
#: one turn of a multi-turn episode: the model's reply to the conversation so far
Reply = Callable[[Messages], str]


class ParseError(ValueError):
    """A generation cannot be read as a task; the message is the rejection reason."""


@dataclass(slots=True)
class Verdict:
    """The grade of one solver attempt: solved, not solved, or ungradable (``solved is None``)."""

    solved: bool | None
    reason: str | None = None
    diagnostics: dict[str, Any] = field(default_factory=dict)


class Domain(ABC):
    """A task domain. Subclass it in a plugin and register the class with ``register_domains``."""

    #: registered name and the component registry, filled in by the core (``Registry.domain``);
    #: a domain that runs code gets its sandbox from ``self.registry``
    name: str = ""
    registry: Registry | None = None
    #: names of registered validity predicates applied after parsing, in order
    validity_predicates: Sequence[str] = ()
    #: workflow markers a generation can reach, for partial-credit rewards (seed 002)
    workflow_markers: Sequence[str] = ()
    #: an agent domain: the generator and the solver act over many turns in an environment
    #: (``episode``, ``solver_episode``) instead of answering one prompt
    multi_turn: bool = False

    @abstractmethod
    def contexts(self) -> list[Context]:
        """Everything the generator may be conditioned on; each context has a stable id."""

    @abstractmethod
    def generator_prompt(self, context: Context) -> Messages:
        """Chat messages asking the generator for one task given ``context``.

        A final assistant message prefills the start of the answer: the model continues it, and the
        task's ``generation`` is that start followed by what the model wrote.
        """

    @abstractmethod
    def parse(self, generation: str) -> dict[str, Any]:
        """The task payload in ``generation``; raise :class:`ParseError` with a reason if there is none."""

    @abstractmethod
    def render(self, payload: dict[str, Any]) -> str | list[str]:
        """The task as the frozen reference model reads it: one text, or a list of turns for a
        multi-turn trajectory (pooled per turn, then over turns)."""

    @abstractmethod
    def solver_prompt(self, payload: dict[str, Any]) -> Messages:
        """Chat messages asking the solver to solve the task; a final assistant message prefills the
        start of the attempt, and the attempt graded is that start followed by what the solver wrote."""

    @abstractmethod
    def grade(self, payload: dict[str, Any], attempt: str) -> Verdict:
        """Grade one solver attempt against the task."""

    def episode(self, context: Context, reply: Reply, seed: int) -> str:
        """Multi-turn domains: one generator episode on ``context``, each turn answered by ``reply``
        (``seed`` seeds anything else the episode draws); the generation is the whole trajectory as
        text, which ``parse`` reads back."""
        raise NotImplementedError(f"domain {self.name!r} is single-turn: it has no episodes")

    def solver_episode(self, payload: dict[str, Any], reply: Reply) -> str:
        """Multi-turn domains: one solver attempt at a task, as text that ``grade`` reads."""
        raise NotImplementedError(f"domain {self.name!r} is single-turn: it has no solver episodes")

    def topic(self, payload: dict[str, Any]) -> str | None:
        """A coarse topic, for the top-topic diversity metric; None when the domain has none."""
        return None

    def markers_reached(self, generation: str) -> list[str]:
        """Which of ``workflow_markers`` the generation reached (partial credit for invalid ones)."""
        return []

    def verifier_score(self, payload: dict[str, Any]) -> float | None:
        """A valid task's own verifier score (seed 002: the held-out metric of a submission); None
        when the domain has none."""
        return None


def make_task(
    task_id: str,
    domain: Domain,
    context: Context,
    generation: str,
    generator: str,
    predicates: dict[str, Callable[[Task, Domain], Validity]],
) -> Task:
    """Parse, render and check one generation. Never raises on what the model wrote."""
    fields: dict[str, Any] = dict(
        id=task_id, domain=domain.name, context_id=context.id, generation=generation, generator=generator
    )
    try:
        payload = domain.parse(generation)
    except ParseError as exc:
        return Task(**fields, validity=Validity.reject(f"parse: {exc}"))
    task = Task(
        **fields, payload=payload, text=domain.render(payload), topic=domain.topic(payload), validity=Validity.ok()
    )
    for name in domain.validity_predicates:
        validity = predicates[name](task, domain)
        if not validity.valid:
            task.validity = Validity.reject(f"{name}: {validity.reason}")
            break
    return task


def grade_attempt(domain: Domain, task: Task, text: str) -> SolverAttempt:
    """One solver attempt at ``task``, graded by its domain."""
    verdict = domain.grade(task.payload, text)
    return SolverAttempt(text=text, solved=verdict.solved, reason=verdict.reason, diagnostics=verdict.diagnostics)
