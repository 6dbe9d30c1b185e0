"""The expensive half, in one place: solver attempts and generator episodes, run by an executor.

A *job* is one solver attempt at a task (attempt ``j`` of K, graded), one generator episode on a
context (parsed and checked into a Task), or the grading of an attempt a policy in training wrote.
Every stage that needs one (``label``, ``evaluate``, ``generate``, the solver-in-the-loop reward,
``solve-train``'s rewards and held-out evaluation, ``self-train``) calls :func:`graded_attempts`,
:func:`sample_tasks` or :func:`graded_texts` here; an *executor* plugin
(``executor.name``: ``local`` threads on this machine, ``ray`` tasks on a cluster) decides where the
jobs run. The calling process (the driver) is the only one that writes run files.

Each job carries its own seed, drawn from (the seed its caller passes: the run's, or an evaluation's;
task id; attempt index), never from its place in a batch, so what a run writes does not depend on the
executor, the number of workers, the order in which jobs finish or where a resumed run starts again.
"""

from __future__ import annotations

import logging
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.backend import prefill
from propel_core.config import DomainConfig, LabelConfig, ModelConfig, Sampling
from propel_core.domain import Messages, Reply, grade_attempt, make_task
from propel_core.errors import PropelError
from propel_core.records import Context, JsonlWriter, Label, Record, SolverAttempt, Task, Validity, iter_jsonl

if TYPE_CHECKING:
    from propel_core.plugins import Registry
    from propel_core.run import Run

log = logging.getLogger("propel")

#: a backend's ``generate``: (prompts, sampling, n, seed) -> n completions per prompt
Generate = Callable[..., list[list[str]]]


def job_seed(seed: int, key: str, index: int = 0) -> int:
    """The seed of job ``index`` of ``key`` (a task id) in a run seeded ``seed``: the same in any
    process, on any machine, whatever else runs beside it."""
    return zlib.crc32(f"{seed}/{key}/{index}".encode())


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


def model_reply(generate: Generate, sampling: Sampling, seed: int) -> Reply:
    """A ``Reply`` that asks the model for one completion of the conversation per turn; turn ``i`` is
    seeded ``seed + i``, so an episode replays exactly. The reply includes the prompt's prefill."""
    turn = 0

    def reply(messages: Messages) -> str:
        nonlocal turn
        turn += 1
        return prefill(messages) + generate([messages], sampling, n=1, seed=[seed + turn - 1])[0][0]

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
        reply = model_reply(generate or self.generate, self.sampling, job.seed)
        if isinstance(job, Attempt):
            payload = job.task.payload
            try:
                if domain.multi_turn:
                    text = domain.solver_episode(payload, reply)
                else:
                    text = reply(domain.solver_prompt(payload))
            except PropelError:
                raise
            except Exception as exc:
                log.warning("task %s: a solver episode failed: %s: %s", job.task.id, type(exc).__name__, exc)
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
        predicates = {name: self.registry.get("validity_predicates", name) for name in domain.validity_predicates}
        return make_task(job.task_id, domain, job.context, generation, self.model.model_id, predicates)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def no_model(prompts, sampling, n=1, seed=None) -> list[list[str]]:
    raise PropelError("the domain's generator uses no model (uses_generator_model is False), yet its episode asked it")


class AttemptRecord(Record):
    """One finished attempt, journaled before its task's label is complete."""

    task_id: str
    index: int
    attempt: SolverAttempt


def journal_path(path: Path) -> Path:
    """Where finished attempts of unfinished labels wait: ``labels.jsonl`` -> ``labels.attempts.jsonl``."""
    return path.with_suffix(".attempts.jsonl")


def graded_attempts(
    run: Run,
    tasks: list[Task],
    k: int,
    model: ModelConfig,
    seed: int,
    journal: Path | None = None,
    description: str = "solve",
) -> Iterator[tuple[Task, list[SolverAttempt]]]:
    """K graded attempts at every task by the solver ``model``, yielded per task once all K are done
    (tasks in any order, attempts in index order); attempt ``j`` of a task is seeded from ``seed``,
    the task id and ``j``.

    With ``journal``, every finished attempt is appended there first and a rerun redoes only the
    attempts the journal lacks, so an interrupted label loses no finished solver run.
    """
    done: dict[str, dict[int, SolverAttempt]] = defaultdict(dict)
    if journal is not None:
        wanted = {task.id for task in tasks}
        for record in iter_jsonl(journal, AttemptRecord):
            if record.task_id in wanted and record.index < k:
                done[record.task_id][record.index] = record.attempt
    by_id = {task.id: task for task in tasks}
    jobs = [Attempt(task, j, job_seed(seed, task.id, j)) for task in tasks for j in range(k) if j not in done[task.id]]
    complete = [task for task in tasks if len(done[task.id]) == k]
    for task in complete:
        yield task, [done[task.id][j] for j in range(k)]
    if not jobs:
        return
    worker = run.worker(model)
    writer = JsonlWriter(journal) if journal is not None else None
    try:
        with run.progress(f"{description} ({model.model_id}, K={k})", total=len(tasks)) as advance:
            advance(len(complete))
            for job, attempt in run.executor().run(worker, jobs):
                found = done[job.task.id]
                found[job.index] = attempt
                if writer is not None:
                    writer.write(AttemptRecord(task_id=job.task.id, index=job.index, attempt=attempt))
                finished = len(found) == k
                advance(int(finished), in_flight=run.executor().in_flight)
                if finished:
                    yield by_id[job.task.id], [found[j] for j in range(k)]
    finally:
        if writer is not None:
            writer.close()


def graded_texts(run: Run, attempts: list[tuple[Task, str]], model: ModelConfig) -> list[SolverAttempt]:
    """The grades of attempts already written, in order, each a job of the run's executor (so a
    policy's rollouts are verified as widely as the executor spreads them); ``model`` is the role the
    attempts stand for (its worker is cached under it; it is never loaded)."""
    jobs = [Grading(task, text) for task, text in attempts]
    grades = dict(run.executor().run(run.worker(model), jobs))
    return [grades[job] for job in jobs]


def label_tasks(
    run: Run, tasks: list[Task], path: Path, solver: ModelConfig, label: LabelConfig, seed: int
) -> list[Label]:
    """Label ``tasks`` (valid ones) into ``path`` with ``label.k`` attempts each by ``solver``, skipping
    every task that already has a label there."""
    done = {existing.task_id for existing in iter_jsonl(path, Label)}
    todo = [task for task in tasks if task.id not in done]
    if done:
        log.info("%s already has %d labels; %d tasks to go", path.name, len(done), len(todo))
    if todo:
        with JsonlWriter(path) as out:
            for task, attempts in graded_attempts(run, todo, label.k, solver, seed, journal_path(path), "label"):
                out.write(label_of(task, attempts, label))
    journal_path(path).unlink(missing_ok=True)  # every label is whole now
    return list(iter_jsonl(path, Label))


def solver_labels(
    run: Run, solver: ModelConfig, label: LabelConfig, seed: int, description: str = "solve"
) -> Callable[[list[Task]], list[Label]]:
    """A function that labels tasks now, with no file: what a reward that reads live solver utility
    (the solver-in-the-loop baseline) calls once per batch."""

    def solve(tasks: list[Task]) -> list[Label]:
        graded = graded_attempts(run, tasks, label.k, solver, seed, description=description)
        return [label_of(task, attempts, label) for task, attempts in graded]

    return solve


def label_of(task: Task, attempts: list[SolverAttempt], config: LabelConfig) -> Label:
    """The label that K graded attempts give under the configured band."""
    if len(attempts) != config.k:
        raise PropelError(f"task {task.id} has {len(attempts)} graded attempts, not K={config.k}")
    return Label.from_attempts(task.id, attempts, (config.band_low, config.band_high), config.min_valid_attempts)


def task_id(index: int) -> str:
    return f"t{index:06d}"


def sample_tasks(run: Run, model: ModelConfig, contexts: list[Context], path: Path, seed: int) -> list[Task]:
    """One task per context (task ``i`` from ``contexts[i]``), appended to ``path`` as each episode
    finishes; tasks already there are kept and not redone. Generation ``i`` is seeded by its task id,
    so a resumed run, another executor, or another model given the same contexts uses the same seeds
    (and the same contexts: the domain's ``episode_contexts`` of them, made here before any job runs).
    """
    done = {task.id for task in iter_jsonl(path, Task)}
    contexts = run.domain().episode_contexts(contexts, seed)
    jobs = [
        Episode(task_id(i), context, job_seed(seed, task_id(i)))
        for i, context in enumerate(contexts)
        if task_id(i) not in done
    ]
    if done and jobs:
        log.info("%s already has %d tasks; %d to go", path.name, len(done), len(jobs))
    if jobs:
        worker = run.worker(model)
        with JsonlWriter(path) as out, run.progress(f"generate ({model.model_id})", total=len(contexts)) as advance:
            advance(len(contexts) - len(jobs))
            for _, task in run.executor().run(worker, jobs):
                out.write(task)
                advance(1, in_flight=run.executor().in_flight)
    order = {task_id(i): i for i in range(len(contexts))}
    return sorted(iter_jsonl(path, Task), key=lambda task: order.get(task.id, len(order)))


def sample_and_label(
    run: Run,
    generator: ModelConfig,
    contexts: list[Context],
    folder: Path,
    solver: ModelConfig,
    label: LabelConfig,
    seed: int,
) -> tuple[list[Task], list[Label]]:
    """One arm of an evaluation: a task per context from ``generator`` (``folder/tasks.jsonl``), and
    the valid ones labeled by ``solver`` (``folder/labels.jsonl``); both files resume."""
    tasks = sample_tasks(run, generator, contexts, folder / "tasks.jsonl", seed)
    valid = [task for task in tasks if task.validity.valid]
    return tasks, label_tasks(run, valid, folder / "labels.jsonl", solver, label, seed)
