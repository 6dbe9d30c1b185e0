"""generate: the generator writes tasks from sampled contexts -> ``RUN/tasks.jsonl``.

Every generation becomes a record, invalid ones too, with the rejection reason. Contexts are drawn
up front from the seeded sampler, so a rerun after a crash draws the same ones and only writes the
tasks still missing.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from propel_core.backend import ModelBackend
from propel_core.domain import generations, make_task
from propel_core.records import Context, JsonlWriter, Task, iter_jsonl
from propel_core.run import Run, log


def task_id(index: int) -> str:
    return f"t{index:06d}"


def generate(run: Run) -> None:
    """Sample tasks from the generator, parse them and check validity -> tasks.jsonl."""
    tasks = sample_tasks(run, run.backend("generator"), draw_contexts(run), run.dir / "tasks.jsonl")
    print(funnel(tasks))


def draw_contexts(run: Run) -> list[Context]:
    """``generate.num_tasks`` contexts from the configured sampler, seeded by the run's seed."""
    config = run.config
    sampler_factory = run.component("context_samplers", config.generate.context_sampler)
    sampler = sampler_factory(run.domain().contexts(), seed=config.seed, **config.generate.sampler_options)
    return sampler.sample(config.generate.num_tasks)


def sample_tasks(run: Run, backend: ModelBackend, contexts: list[Context], path: Path) -> list[Task]:
    """One task per context from ``backend``, appended to ``path``; tasks already there are kept.

    Generation ``i`` is seeded by its position, so a resumed run, or another model given the same
    contexts, samples with the seeds the first one used.
    """
    config, domain = run.config, run.domain()
    predicates = {name: run.component("validity_predicates", name) for name in domain.validity_predicates}
    done = {task.id for task in iter_jsonl(path, Task)}
    todo = [(i, context) for i, context in enumerate(contexts) if task_id(i) not in done]
    if done:
        log.info("%s already has %d tasks; %d to go", path.name, len(done), len(todo))
    if todo:
        path.parent.mkdir(parents=True, exist_ok=True)
        batch_size = config.generator.batch_size
        with JsonlWriter(path) as out, run.progress(f"generate ({backend.model_id})", total=len(contexts)) as advance:
            advance(len(contexts) - len(todo))
            for start in range(0, len(todo), batch_size):
                chunk = todo[start : start + batch_size]
                contexts_now = [context for _, context in chunk]
                texts = generations(domain, backend, contexts_now, config.generator.sampling, config.seed + chunk[0][0])
                for (index, context), generation in zip(chunk, texts, strict=True):
                    out.write(make_task(task_id(index), domain, context, generation, backend.model_id, predicates))
                advance(len(chunk))
    return list(iter_jsonl(path, Task))


def funnel(tasks: list[Task]) -> str:
    """generated -> parsed -> valid, and the most common rejection reasons."""
    parsed = sum(task.payload is not None for task in tasks)
    valid = sum(task.validity.valid for task in tasks)
    lines = [f"generated {len(tasks)} -> parsed {parsed} -> valid {valid}"]
    reasons = Counter(task.validity.reason for task in tasks if not task.validity.valid)
    for reason, count in reasons.most_common(5):
        lines.append(f"  {count:5d}  {reason}")
    return "\n".join(lines)
