"""The interface every task domain implements, and how the core turns a generation into a Task."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from propel_core.errors import PropelError, Unavailable
from propel_core.records import Context, SolverAttempt, Task, Validity, check_value

if TYPE_CHECKING:
    from propel_core.config import Sampling
    from propel_core.contracts import RepositorySandbox, Sandbox
    from propel_core.plugins import Registry

log = logging.getLogger("propel")

Messages = list[dict[str, str]]
#: one turn of a multi-turn episode: the model's reply to the conversation so far
Reply = Callable[[Messages], str]
#: ``register_validity_predicates``: ``predicate(task, domain) -> Validity``; never raises on bad input
ValidityPredicate = Callable[[Task, "Domain"], Validity]
#: what a domain's sandbox runs (``Domain.sandbox_runs``): programs (``run_python``, ``Registry.sandbox``)
#: or commands in checkouts (``workspace``, ``Registry.repository_sandbox``)
SANDBOX_RUNS = ("programs", "repositories")
#: held while a domain makes its sandbox, so that the threads that ask first wait for one sandbox
_SANDBOX_LOCK = threading.Lock()


class ParseError(ValueError):
    """A generation cannot be read as a task; the message is the rejection reason."""


@dataclass(slots=True)
class Verdict:
    """The grade of one solver attempt: solved, not solved, or ungradable (``solved is None``).

    A domain whose attempts earn partial credit (the ML-engineering RL study) puts in ``diagnostics``
    the ``markers`` the attempt reached (names from ``workflow_markers``) and its ``verifier_score``
    (None when its output is invalid); ``solve-train``'s reward rules read those two.

    A verdict is always a record: a value of ``diagnostics`` no record can hold (a non-finite
    metric, a value too deep or too large) becomes None, with the reason under ``unrecordable``.
    """

    solved: bool | None = field(metadata={"doc": "True, False, or None when the attempt cannot be graded"})
    reason: str | None = field(default=None, metadata={"doc": "why it failed or could not be graded"})
    diagnostics: dict[str, Any] = field(
        default_factory=dict, metadata={"doc": "``markers`` and ``verifier_score`` for partial credit, and more"}
    )

    def __post_init__(self) -> None:
        if self.solved is not None and type(self.solved) is not bool:
            if getattr(getattr(self.solved, "dtype", None), "kind", None) != "b":  # numpy's bool is a bool
                kind = type(self.solved).__name__
                raise TypeError(f"a verdict is solved True, False or None, not a value of type {kind}")
            self.solved = bool(self.solved)
        if self.reason is not None and type(self.reason) is not str:
            reason = self.reason
            self.reason = str.__str__(reason) if isinstance(reason, str) else f"({type(reason).__name__} as reason)"
        if self.reason is not None and check_value(self.reason) is not None:  # a surrogate pair held as two
            self.reason = self.reason.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
        self.diagnostics = recordable(self.diagnostics)


def recordable(diagnostics: Any) -> dict[str, Any]:
    """``diagnostics`` as a record can hold them, so that a verdict is always writable: each value
    ``check_value`` refuses (a non-finite metric, a value too deep or too large, a type JSON lacks)
    becomes None, and ``unrecordable`` says why, by key. The verdict itself stands."""
    if isinstance(diagnostics, dict) and type(diagnostics) is not dict:  # an OrderedDict, a Counter
        diagnostics = dict(diagnostics.items())
    if type(diagnostics) is dict and check_value(diagnostics, "diagnostics") is None:
        return diagnostics
    if type(diagnostics) is not dict:
        return {"unrecordable": {"diagnostics": f"of type {type(diagnostics).__name__}, not a dict"}}
    kept: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for key, value in diagnostics.items():
        if type(key) is not str or check_value(key) is not None:
            problems[f"<{type(key).__name__} key>"] = "a key that is not a plain string"
        elif problem := check_value(value, f"diagnostics.{key}"[:200]):
            kept[key], problems[key] = None, problem
        else:
            kept[key] = value
    kept["unrecordable"] = problems
    if problem := check_value(kept, "diagnostics"):  # each value fits, all of them together do not
        return {"unrecordable": {"diagnostics": problem}}
    return kept


class Domain(ABC):
    """A task domain. Subclass it in a plugin and register the class with ``register_domains``.

    One domain object serves every job of a process, and the executor runs jobs concurrently: parse,
    render, the validity predicates, ``grade``, ``episode`` and ``solver_episode`` are called from
    many threads at once. State kept between calls must be safe to share or held per thread or per
    call (``propel_core.testing.assert_same_verdicts_concurrently`` checks the grader).
    """

    #: registered name and the component registry, filled in by the core (``Registry.domain``);
    #: a domain that runs code gets its sandbox from ``self.registry`` (:attr:`sandbox`)
    name: str = ""
    registry: Registry | None = None
    #: names of registered validity predicates applied after parsing, in order
    validity_predicates: Sequence[str] = ()
    #: workflow markers a generation can reach, for partial-credit rewards (the ML-engineering RL study)
    workflow_markers: Sequence[str] = ()
    #: an agent domain: the generator and the solver act over many turns in an environment
    #: (``episode``, ``solver_episode``) instead of answering one prompt
    multi_turn: bool = False
    #: whether the generator's episodes (or prompts) are answered by the generator model; a domain
    #: whose generator is a program (the swe domain's ``generator: procedural``) says False, and the
    #: core then never loads that model for it (generate, evaluate) and refuses to train it
    uses_generator_model: bool = True
    #: strings that end the generator's completion where it first writes one (a single-turn task's
    #: end: "\n" for a one-line task), added to ``generator.sampling.stop``; every backend and the
    #: ``train`` stage's generation stop there, and leave the stop string out
    stop_strings: Sequence[str] = ()
    #: options that hold another component's options, checked against it when the config is read:
    #: ``{"sandbox_options": ("sandboxes", "sandbox")}`` (the options of the sandbox option ``sandbox`` names)
    component_options: ClassVar[dict[str, tuple[str, str]]] = {}
    #: a domain that runs code sets ``self.sandbox_name`` and ``self.sandbox_options`` in ``__init__``
    #: (from its options) and says what its sandbox runs: ``"programs"`` or ``"repositories"``
    sandbox_runs: ClassVar[str] = "programs"
    sandbox_name: str
    sandbox_options: dict[str, Any]
    _sandbox: Sandbox | RepositorySandbox | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.sandbox_runs not in SANDBOX_RUNS:
            raise TypeError(
                f"{cls.__name__}.sandbox_runs is {cls.sandbox_runs!r}; choose one of: {', '.join(SANDBOX_RUNS)}"
            )

    @property
    def sandbox(self) -> Sandbox | RepositorySandbox:
        """The sandbox ``sandbox_name`` with ``sandbox_options``, made by :meth:`make_sandbox` on first
        use and shared from then on. Made under a lock: ``grade`` runs in many threads at once, and the
        first callers wait for one sandbox instead of each making its own. Not in ``__init__``: the
        registry is filled in after it (``Registry.domain``), and a domain is also made where nothing
        runs."""
        if self._sandbox is None:
            with _SANDBOX_LOCK:
                if self._sandbox is None:
                    if self.registry is None:
                        raise PropelError(
                            f"domain {type(self).__name__} has no registry to make its sandbox from: "
                            "make the domain with Registry.domain(name, **options)"
                        )
                    self._sandbox = self.make_sandbox()
        return self._sandbox

    def make_sandbox(self) -> Sandbox | RepositorySandbox:
        """A new sandbox ``sandbox_name`` with ``sandbox_options`` from the registry, one that runs what
        ``sandbox_runs`` says (``Registry.sandbox`` or ``Registry.repository_sandbox`` checks it can);
        :attr:`sandbox` calls it until one is made. Override it to check first what the sandbox's runs
        need."""
        make = self.registry.repository_sandbox if self.sandbox_runs == "repositories" else self.registry.sandbox
        return make(self.sandbox_name, **self.sandbox_options)

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

    def episode_contexts(self, contexts: list[Context], seed: int) -> list[Context]:
        """The contexts a run's generations get, generation ``i`` the ``i``-th, from the ones drawn for
        them and the run's seed; by default the drawn ones. Called once by the driver before any
        generation runs, so a domain that deals things out without replacement (the swe procedural
        generator's mutants) numbers each context's generations here, and what one gets does not
        depend on which worker runs it or when. Keep each context's ``id``."""
        return contexts

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

    def looks_valid(self, payload: dict[str, Any], attempt: str) -> bool:
        """Whether a solver attempt looks gradable, judged without grading it (RM-GRPO: on reward-model
        steps only these get the reward model's score; the others get the partial reward of a run
        that reached no marker). By default every attempt looks valid."""
        return True

    def clean_checks(self, attempt: SolverAttempt) -> list[tuple[str, bool]]:
        """Self-training's clean-up of a verified attempt (the progress-aware sampling study, section
        3.4), in order: each check's name and whether ``attempt`` passes it (one answer, no repeated
        tags, ...), read from what the domain's grader knows. By default none: every verified attempt
        within ``self_train.max_chars`` is kept."""
        return []

    def verifier_score(self, payload: dict[str, Any]) -> float | None:
        """A valid task's own verifier score (the ML-engineering RL study: the held-out metric of a submission); None
        when the domain has none."""
        return None


def generation_stop(domain: Domain, sampling: Sampling) -> list[str]:
    """The stop strings the generator's generation ends at under ``sampling``, in generate, evaluate and
    train alike: the domain's ``stop_strings`` and ``sampling.stop`` for a single-turn domain, none for
    a multi-turn one (an episode ends its own way)."""
    return [] if domain.multi_turn else sampling.stopping_at(domain.stop_strings).stop


#: the reason a generation the length limit cut off is invalid
CUT_OFF = "cut off: the length limit ended the generation before the model did"


def make_task(
    task_id: str,
    domain: Domain,
    context: Context,
    generation: str,
    generator: str,
    predicates: dict[str, ValidityPredicate],
    cut_off: bool = False,
) -> Task:
    """Parse, render and check one generation. A generation the length limit ``cut_off`` is invalid
    unparsed (:data:`CUT_OFF`), in generate, evaluate and train alike: what it would have gone on to
    write is unknown. Never raises on what the model wrote: a parser,
    renderer or predicate that fails unexpectedly rejects the task with the error as its reason, and
    a payload a record cannot hold exactly (``records.check_value``: too deep, a non-finite number...)
    is rejected at parse time, so the task stored is always the task checked."""
    generation = str(generation)  # a plain string: the domain may keep it whole in the payload
    fields: dict[str, Any] = dict(
        id=task_id, domain=domain.name, context_id=context.id, generation=generation, generator=generator
    )
    if cut_off:
        return Task(**fields, validity=Validity.reject(CUT_OFF))
    step = "parse"
    try:
        payload = domain.parse(generation)
        if problem := check_value(payload, "payload"):
            raise ParseError(f"the task cannot be recorded exactly: {problem}")
        step = "render"
        task = Task(
            **fields, payload=payload, text=domain.render(payload), topic=domain.topic(payload), validity=Validity.ok()
        )
        for step in domain.validity_predicates:
            validity = predicates[step](task, domain)
            if not validity.valid:
                task.validity = Validity.reject(f"{step}: {validity.reason}")
                break
        if problem := check_value(task.payload, "payload") or check_value(task.text, "text"):
            return Task(**fields, validity=Validity.reject(f"record: the checked task cannot be stored: {problem}"))
    except ParseError as exc:
        return Task(**fields, validity=Validity.reject(f"parse: {exc}"))
    except Unavailable:
        raise
    except Exception as exc:
        log.warning("task %s: %s failed unexpectedly: %s: %s", task_id, step, type(exc).__name__, exc)
        return Task(**fields, validity=Validity.reject(f"{step} failed: {type(exc).__name__}: {str(exc)[:300]}"))
    return task


def grade_attempt(domain: Domain, task: Task, text: str) -> SolverAttempt:
    """One solver attempt at ``task``, graded by its domain; a grader that fails unexpectedly makes
    the attempt ungradable, with the error as its reason, instead of ending the stage (the caller
    tells the user: ``execution.note_ungradable``, once per kind of error, not per attempt)."""
    text = str(text)  # a plain string, as the grader may keep it whole in the verdict's diagnostics
    try:
        verdict = domain.grade(task.payload, text)
        # a Verdict made anew, with its checks: a grader may change one after making it, subclass it
        # or return an object that only looks like one
        verdict = Verdict(verdict.solved, verdict.reason, verdict.diagnostics)
        return SolverAttempt(text=text, solved=verdict.solved, reason=verdict.reason, diagnostics=verdict.diagnostics)
    except Unavailable:
        raise
    except Exception as exc:
        reason = f"grader failed: {type(exc).__name__}: {str(exc)[:300]}"
        return SolverAttempt(text=text, solved=None, reason=Verdict(None, reason).reason)
