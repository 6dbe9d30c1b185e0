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
import os
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from propel_core.config import LabelConfig, ModelConfig
from propel_core.contracts import Attempt, Episode, Grading, Job, JobRunner
from propel_core.errors import PropelError
from propel_core.records import Context, JsonlWriter, Label, Record, SolverAttempt, Task, iter_jsonl, put_in_order

if TYPE_CHECKING:
    from propel_core.plans import EvaluationPlan, LabelPlan
    from propel_core.services import Services

log = logging.getLogger("propel")


def job_seed(seed: int, key: str, index: int = 0) -> int:
    """The seed of job ``index`` of ``key`` (a task id) in a run seeded ``seed``: the same in any
    process, on any machine, whatever else runs beside it."""
    return zlib.crc32(f"{seed}/{key}/{index}".encode())


class AttemptRecord(Record):
    """One finished attempt, journaled before its task's label is complete."""

    task_id: str
    index: int
    attempt: SolverAttempt


#: how many more times an attempt the harness could not grade (an overloaded machine, a sandbox that
#: did not start) is run before it is recorded ungradable
RETRIES = 2


def graded(
    services: Services, worker: JobRunner, jobs: list[Attempt] | list[Grading]
) -> Iterator[tuple[Job, SolverAttempt]]:
    """Run attempt or grading jobs on the executor and yield ``(job, attempt)`` as each is final: an
    attempt that comes back ungradable runs again, up to ``RETRIES`` more times, never counted as
    failed. A single-turn attempt's text is graded again (the solver's sample is kept, so what a seed
    gives does not depend on the load); a multi-turn episode, or an attempt whose episode failed
    before it wrote anything, runs again whole with its own seed. The attempt yielded lists why each
    earlier try could not be graded (``SolverAttempt.retries``)."""
    multi_turn = services.domain().multi_turn
    first_of: dict[Job, Job] = {}
    reasons: dict[Job, list[str]] = {}
    pending: list[Job] = list(jobs)
    while pending:
        again: list[Job] = []
        for job, attempt in services.executor().run(worker, pending):
            first = first_of.pop(job, job)
            tried = reasons.get(first, [])
            if attempt.solved is None and len(tried) < RETRIES:
                reasons[first] = [*tried, attempt.reason or "no reason given"]
                if isinstance(first, Attempt) and (multi_turn or not attempt.text):
                    retry: Job = Attempt(first.task, first.index, first.seed)
                else:
                    retry = Grading(first.task, attempt.text)
                first_of[retry] = first
                again.append(retry)
                continue
            yield first, attempt.model_copy(update={"retries": reasons.pop(first)}) if tried else attempt
        if again:
            log.info(
                "%d attempts the harness could not grade run again (%s)",
                len(again),
                reasons[first_of[again[0]]][-1][:200],
            )
        pending = again


def solve_counts(services: Services, tasks: list[Task], solver: ModelConfig, k: int, seed: int) -> list[int]:
    """Successes out of ``k`` attempts per task by ``solver``; every arm draws attempt ``j`` of a task
    with the same seed."""
    solved = {
        task.id: sum(bool(attempt.solved) for attempt in attempts)
        for task, attempts in graded_attempts(services, tasks, k, solver, seed)
    }
    return [solved[task.id] for task in tasks]


def journal_path(path: Path) -> Path:
    """Where finished attempts of unfinished labels wait: ``labels.jsonl`` -> ``labels.attempts.jsonl``."""
    return path.with_suffix(".attempts.jsonl")


def graded_attempts(
    services: Services,
    tasks: list[Task],
    k: int,
    model: ModelConfig,
    seed: int,
    journal: Path | None = None,
    description: str = "solve",
    redo: bool = False,
) -> Iterator[tuple[Task, list[SolverAttempt]]]:
    """K graded attempts at every task by the solver ``model``, yielded per task once all K are done
    (tasks in any order, attempts in index order); attempt ``j`` of a task is seeded from ``seed``,
    the task id and ``j``.

    With ``journal``, every finished attempt is appended there first and a rerun redoes only the
    attempts the journal lacks (and, with ``redo``, the ungradable ones it holds), so an interrupted
    label loses no finished solver run. The first ungradable attempt of each kind is logged as it
    comes (:func:`note_ungradable`), not every one.
    """
    done: dict[str, dict[int, SolverAttempt]] = defaultdict(dict)
    if journal is not None:
        wanted = {task.id for task in tasks}
        for record in iter_jsonl(journal, AttemptRecord):
            if record.task_id in wanted and record.index < k and not (redo and record.attempt.solved is None):
                done[record.task_id][record.index] = record.attempt
    by_id = {task.id: task for task in tasks}
    jobs = [Attempt(task, j, job_seed(seed, task.id, j)) for task in tasks for j in range(k) if j not in done[task.id]]
    complete = [task for task in tasks if len(done[task.id]) == k]
    for task in complete:
        yield task, [done[task.id][j] for j in range(k)]
    if not jobs:
        return
    worker = services.worker(model)
    writer = JsonlWriter(journal) if journal is not None else None
    try:
        with services.progress(f"{description} ({model.shown}, K={k})", total=len(tasks)) as advance:
            advance(len(complete))
            for job, attempt in graded(services, worker, jobs):
                found = done[job.task.id]
                found[job.index] = attempt
                note_ungradable(services, description, job.task, attempt)
                if writer is not None:
                    writer.write(AttemptRecord(task_id=job.task.id, index=job.index, attempt=attempt))
                finished = len(found) == k
                advance(int(finished), in_flight=services.executor().in_flight)
                if finished:
                    yield by_id[job.task.id], [found[j] for j in range(k)]
    finally:
        if writer is not None:
            writer.close()


def graded_texts(services: Services, attempts: list[tuple[Task, str]], model: ModelConfig) -> list[SolverAttempt]:
    """The grades of attempts already written, in order, each a job of the run's executor (so a
    policy's rollouts are verified as widely as the executor spreads them); ``model`` is the role the
    attempts stand for (its worker is cached under it; it is never loaded)."""
    jobs = [Grading(task, text) for task, text in attempts]
    grades = dict(graded(services, services.worker(model), jobs))
    for job in jobs:
        note_ungradable(services, "grading", job.task, grades[job])
    return [grades[job] for job in jobs]


def ungradable_kind(reason: str | None) -> str:
    """What tells ungradable attempts apart in a summary: the reason up to its second colon
    (``grader failed: ValueError``), so one error met at many tasks, each message naming its task,
    is one kind."""
    return ":".join((reason or "no reason given").split(":")[:2])


def note_ungradable(services: Services, description: str, task: Task, attempt: SolverAttempt) -> None:
    """Log an ungradable attempt if it is the first of its kind this command meets; the stage's
    summary (:func:`ungradable_summary`) counts the rest."""
    if attempt.solved is None and (kind := ungradable_kind(attempt.reason)) not in services.ungradable_kinds:
        services.ungradable_kinds.add(kind)
        log.warning(
            "%s: task %s: an attempt is ungradable: %s (more like it are counted at the end)",
            description,
            task.id,
            attempt.reason,
        )


def ungradable_summary(services: Services, stage: str, labels: list[Label]) -> None:
    """Log the stage's line on the ungradable attempts ``labels`` hold (:func:`ungradable_line`) and
    keep it in ``services.ungradable``, which makes the command exit with status 3."""
    if line := ungradable_line(stage, labels):
        log.warning("%s", line)
        services.ungradable.append(line)


def ungradable_line(stage: str, labels: list[Label]) -> str | None:
    """One line on the ungradable attempts ``labels`` hold (None when there are none): how many, the
    commonest error, and how to redo them."""
    ungradable = [a for label in labels for a in label.attempts if a.solved is None]
    if not ungradable:
        return None
    kinds = Counter(ungradable_kind(a.reason) for a in ungradable)
    common, count = kinds.most_common(1)[0]
    example = next(a.reason or "no reason given" for a in ungradable if ungradable_kind(a.reason) == common)
    more = f", {count - 1} more like it" if count > 1 else ""
    others = f"; {len(kinds) - 1} other kind{'s' * (len(kinds) > 2)} of error" if len(kinds) > 1 else ""
    total = sum(len(label.attempts) for label in labels)
    return (
        f"{stage}: {len(ungradable)} of {total} attempts ungradable ({example[:200]}{more}{others}); "
        "rerun with --redo-ungradable after fixing the cause"
    )


def label_tasks(services: Services, tasks: list[Task], path: Path, plan: LabelPlan, redo: bool = False) -> list[Label]:
    """Label ``tasks`` (valid ones) into ``path`` as ``plan`` says (``label.k`` attempts each by its
    solver), skipping every task that already has a label there; with ``redo``, a label holding an
    ungradable attempt is made again, its ungradable attempts run anew and its gradable ones kept
    (:func:`reopen_ungradable`)."""
    if redo:
        reopen_ungradable(path)
    done = {existing.task_id for existing in iter_jsonl(path, Label)}
    todo = [task for task in tasks if task.id not in done]
    if done:
        log.info("%s already has %d labels; %d tasks to go", path.name, len(done), len(todo))
    if todo:
        journal = journal_path(path)
        with JsonlWriter(path) as out:
            graded = graded_attempts(
                services, todo, plan.label.k, plan.solver, plan.seed, journal, plan.description, redo
            )
            for task, attempts in graded:
                out.write(label_of(task, attempts, plan.label))
    journal_path(path).unlink(missing_ok=True)  # every label is whole now
    put_in_order(path, Label, lambda label: label.task_id)
    return list(iter_jsonl(path, Label))


def reopen_ungradable(path: Path) -> None:
    """Take every label holding an ungradable attempt out of ``path`` (the labels file), its gradable
    attempts journaled first, so labeling its task again runs only the attempts that were ungradable,
    with their own seeds. Safe to interrupt anywhere: the journal is written before the labels file
    is replaced whole, and a rerun goes on from either."""
    labels = list(iter_jsonl(path, Label))
    reopened = {label.task_id for label in labels if any(a.solved is None for a in label.attempts)}
    if not reopened:
        return
    with JsonlWriter(journal_path(path)) as journal:
        for label in labels:
            if label.task_id in reopened:
                for index, attempt in enumerate(label.attempts):
                    if attempt.solved is not None:
                        journal.write(AttemptRecord(task_id=label.task_id, index=index, attempt=attempt))
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.unlink(missing_ok=True)
    with JsonlWriter(partial) as kept:
        for label in labels:
            if label.task_id not in reopened:
                kept.write(label)
    os.replace(partial, path)
    log.info("%s: %d labels with ungradable attempts are made again", path.name, len(reopened))


def solver_labels(services: Services, plan: LabelPlan) -> Callable[[list[Task]], list[Label]]:
    """A function that labels tasks now as ``plan`` says, with no file: what a reward that reads live solver utility
    (the solver-in-the-loop baseline) calls once per batch, and an audit. Its labels come in the order
    of the tasks given, whatever order their attempts finished in."""

    def solve(tasks: list[Task]) -> list[Label]:
        graded = graded_attempts(services, tasks, plan.label.k, plan.solver, plan.seed, description=plan.description)
        labels = {task.id: label_of(task, attempts, plan.label) for task, attempts in graded}
        return [labels[task.id] for task in tasks if task.id in labels]

    return solve


def label_of(task: Task, attempts: list[SolverAttempt], config: LabelConfig) -> Label:
    """The label that K graded attempts give under the configured band."""
    if len(attempts) != config.k:
        raise PropelError(f"task {task.id} has {len(attempts)} graded attempts, not K={config.k}")
    return Label.from_attempts(task.id, attempts, (config.band_low, config.band_high), config.min_valid_attempts)


def task_id(index: int) -> str:
    return f"t{index:06d}"


def sample_tasks(services: Services, model: ModelConfig, contexts: list[Context], path: Path, seed: int) -> list[Task]:
    """One task per context (task ``i`` from ``contexts[i]``), appended to ``path`` as each episode
    finishes; tasks already there are kept and not redone. Generation ``i`` is seeded by its task id,
    so a resumed run, another executor, or another model given the same contexts uses the same seeds
    (and the same contexts: the domain's ``episode_contexts`` of them, made here before any job runs).
    """
    done = {task.id for task in iter_jsonl(path, Task)}
    contexts = services.domain().episode_contexts(contexts, seed)
    jobs = [
        Episode(task_id(i), context, job_seed(seed, task_id(i)))
        for i, context in enumerate(contexts)
        if task_id(i) not in done
    ]
    if done and jobs:
        log.info("%s already has %d tasks; %d to go", path.name, len(done), len(jobs))
    if jobs:
        worker = services.worker(model)
        with (
            JsonlWriter(path) as out,
            services.progress(f"generate ({model.shown})", total=len(contexts)) as advance,
        ):
            advance(len(contexts) - len(jobs))
            for _, task in services.executor().run(worker, jobs):
                out.write(task)
                advance(1, in_flight=services.executor().in_flight)
    order = {task_id(i): i for i in range(len(contexts))}
    put_in_order(path, Task, lambda task: (order.get(task.id, len(order)), task.id))
    return list(iter_jsonl(path, Task))


def sample_and_label(
    services: Services,
    plan: EvaluationPlan,
    adapter: Path | None,
    contexts: list[Context],
    folder: Path,
    redo: bool = False,
) -> tuple[list[Task], list[Label]]:
    """One arm of an evaluation: a task per context from the plan's generator with ``adapter`` (None:
    the base model) into ``folder/tasks.jsonl``, and the valid ones labeled as ``plan.labels`` says
    (``folder/labels.jsonl``); both seeded by the evaluation's seed, both resume (``redo``: see
    :func:`label_tasks`)."""
    generator = plan.generator.with_adapter(adapter)
    tasks = sample_tasks(services, generator, contexts, folder / "tasks.jsonl", plan.labels.seed)
    valid = [task for task in tasks if task.validity.valid]
    return tasks, label_tasks(services, valid, folder / "labels.jsonl", plan.labels, redo)
