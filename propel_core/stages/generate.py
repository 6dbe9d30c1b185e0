"""generate: the generator writes tasks from sampled contexts -> ``RUN/tasks.jsonl``.

Every generation becomes a record, invalid ones too, with the rejection reason. Contexts are drawn
up front from the seeded sampler and task ``i`` is seeded by its id, so a rerun after a crash draws
the same contexts and writes exactly the tasks still missing, as an uninterrupted run would. The
episodes (one model call each, or a whole agent episode in a multi-turn domain) run on the
configured executor.
"""

from __future__ import annotations

from collections import Counter

from propel_core.execution import sample_tasks
from propel_core.provenance import holds_records
from propel_core.records import Task
from propel_core.run import Run


def generate(run: Run) -> None:
    """Sample tasks from the generator, parse them and check validity -> tasks.jsonl."""
    config = run.config
    path = run.dir / "tasks.jsonl"
    run.claim("tasks.jsonl", exists=holds_records(path))
    contexts = run.context_sampler(config.seed).sample(config.generate.num_tasks)
    tasks = sample_tasks(run.services, config.generator, contexts, path, config.seed)
    counts = funnel_counts(tasks)
    run.track("generate", counts)
    run.say(funnel(tasks, counts))


def funnel_counts(tasks: list[Task]) -> dict[str, int]:
    return {
        "generated": len(tasks),
        "parsed": sum(task.payload is not None for task in tasks),
        "valid": sum(task.validity.valid for task in tasks),
    }


def funnel(tasks: list[Task], counts: dict[str, int]) -> str:
    """generated -> parsed -> valid, and the most common rejection reasons."""
    lines = [f"generated {counts['generated']} -> parsed {counts['parsed']} -> valid {counts['valid']}"]
    reasons = Counter(task.validity.reason for task in tasks if not task.validity.valid)
    for reason, count in reasons.most_common(5):
        lines.append(f"  {count:5d}  {reason}")
    return "\n".join(lines)
