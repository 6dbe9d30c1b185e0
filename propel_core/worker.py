"""What runs one job of an executor (``propel_core.contracts.Job``): the domain and a model with its
sampling, rebuilt from settings in any process (a Ray worker gets it pickled, without its registry,
domain or model, and loads them on first use).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from propel_core.backend import Completion, prefill, was_cut_off
from propel_core.config import DomainConfig, ModelConfig, Sampling
from propel_core.contracts import Attempt, Episode, Grading, Job
from propel_core.domain import Messages, Reply, generation_stop, grade_attempt, make_task
from propel_core.errors import PropelError
from propel_core.records import SolverAttempt, Task, Validity

if TYPE_CHECKING:
    from propel_core.plugins import Registry

log = logging.getLogger("propel")

#: a backend's ``generate``: (prompts, sampling, n, seed) -> n completions per prompt
Generate = Callable[..., list[list[str]]]


#: what the generator reads before a context's trace (``Context.trace``)
TRACE_PREAMBLE = "How the solver did on tasks attempted recently (solved / graded attempts: the task):"


def traced(messages: Messages, trace: str | None, at: int | None = None) -> Messages:
    """``messages`` with ``trace`` (a context's; None: none) after ``TRACE_PREAMBLE`` at the end of
    message ``at`` (None: the last user message): how every domain's generator prompt shows what the
    solver has mastered, the domain unchanged."""
    if trace is None:
        return messages
    at = last_user_message(messages) if at is None else at
    shown = dict(messages[at], content=f"{messages[at]['content']}\n\n{TRACE_PREAMBLE}\n{trace}")
    return [*messages[:at], shown, *messages[at + 1 :]]


def tracing(reply: Reply, trace: str) -> Reply:
    """``reply`` showing ``trace`` in every turn's conversation, always in the message that was the
    first turn's last user message, so a multi-turn episode's history keeps its first prompt as the
    model first read it."""
    at: int | None = None

    def traced_reply(messages: Messages) -> str:
        nonlocal at
        at = last_user_message(messages) if at is None else at
        return reply(traced(messages, trace, at))

    return traced_reply


def last_user_message(messages: Messages) -> int:
    users = [i for i, message in enumerate(messages) if message["role"] == "user"]
    if not users:
        raise PropelError("the generator prompt has no user message to show the context's trace in")
    return users[-1]


def model_reply(generate: Generate, sampling: Sampling, seed: int) -> Reply:
    """A ``Reply`` that asks the model for one completion of the conversation per turn; turn ``i`` is
    seeded ``seed + i``, so an episode replays exactly. The reply includes the prompt's prefill, and
    says whether the length limit cut it off (a ``Completion``)."""
    turn = 0

    def reply(messages: Messages) -> str:
        nonlocal turn
        turn += 1
        completion = generate([messages], sampling, n=1, seed=[seed + turn - 1])[0][0]
        return Completion(prefill(messages) + completion, was_cut_off(completion))

    return reply


class Worker:
    """What a job runs with: the run's domain and one model role with its sampling.

    Pickled (to a Ray worker) it keeps only its configuration; the process that unpickles it builds
    its own registry, domain and backend on first use.
    """

    def __init__(
        self,
        domain: DomainConfig,
        model: ModelConfig,
        sampling: Sampling,
        registry: Registry | None = None,
        built_domain: Any = None,
    ):
        self.domain_config, self.model, self.sampling = domain, model, sampling
        self._registry, self._domain = registry, built_domain

    def __getstate__(self) -> dict[str, Any]:
        return {"domain_config": self.domain_config, "model": self.model, "sampling": self.sampling}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _registry=None, _domain=None)

    def key(self) -> str:
        """Workers with equal keys run jobs the same way (Ray workers cache one per key)."""
        return "\n".join(part.model_dump_json() for part in (self.domain_config, self.model, self.sampling))

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            from propel_core.plugins import Registry

            self._registry = Registry.build()
        return self._registry

    @property
    def domain(self):
        if self._domain is None:
            self._domain = self.registry.domain(self.domain_config.name, **self.domain_config.options)
        return self._domain

    @property
    def backend(self):
        return self.registry.backend(self.model)

    def generate(self, prompts, sampling, n=1, seed=None) -> list[list[str]]:
        """The model, loaded on first use (a procedural generator never loads it)."""
        return self.backend.generate(prompts, sampling, n=n, seed=seed)

    def run(self, job: Job, generate: Generate | None = None) -> SolverAttempt | Task:
        """Run one job; ``generate`` replaces the backend's (the local executor's batched turns).

        Nothing a model does ends the stage: an episode that fails unexpectedly (the domain's agent
        loop raising on what a tool call left behind, say) costs its own record, a rejected task or
        an ungradable attempt (the harness failed, not the solver) with the error as its reason. A
        ``PropelError`` (a backend that cannot answer, a sandbox layer missing) still stops the run."""
        domain = self.domain
        if isinstance(job, Grading):
            return grade_attempt(domain, job.task, job.text)
        if isinstance(job, Episode) and not domain.uses_generator_model:
            generate = no_model  # the generator model is never loaded for such a domain
        sampling = self.sampling
        if isinstance(job, Episode):
            sampling = sampling.model_copy(update={"stop": generation_stop(domain, sampling)})
        reply = model_reply(generate or self.generate, sampling, job.seed)
        if isinstance(job, Episode) and job.context.trace is not None:
            reply = tracing(reply, job.context.trace)
        if isinstance(job, Attempt):
            payload = job.task.payload
            try:
                if domain.multi_turn:
                    text = domain.solver_episode(payload, reply)
                else:
                    text = reply(domain.solver_prompt(payload))
            except PropelError:
                raise
            except Exception as exc:  # counted and shown once per kind by graded_attempts
                return SolverAttempt(text="", solved=None, reason=f"episode failed: {_error(exc)}")
            return grade_attempt(domain, job.task, text)
        try:
            if domain.multi_turn:
                generation = domain.episode(job.context, reply, job.seed)
            else:
                generation = reply(domain.generator_prompt(job.context))
        except PropelError:
            raise
        except Exception as exc:
            log.warning("task %s: a generator episode failed: %s: %s", job.task_id, type(exc).__name__, exc)
            return Task(
                id=job.task_id,
                domain=domain.name,
                context_id=job.context.id,
                generation="",
                validity=Validity.reject(f"episode failed: {_error(exc)}"),
                generator=self.model.model_id,
            )
        predicates = self.registry.validity_predicates(domain)
        return make_task(
            job.task_id, domain, job.context, generation, self.model.model_id, predicates, was_cut_off(generation)
        )


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def no_model(prompts, sampling, n=1, seed=None) -> list[list[str]]:
    raise PropelError("the domain's generator uses no model (uses_generator_model is False), yet its episode asked it")
