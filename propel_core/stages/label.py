"""label: the solver attempts every valid task K times; graded attempts give the utility -> labels.jsonl.

This is the expensive stage, so it is append-only and resumable: the attempts run on the configured
executor, each finished attempt is journaled (``labels.attempts.jsonl``), and each label is written
as one whole flushed line once its task's K attempts are done. A rerun (after a crash, Ctrl-C or
kill -9) skips every task that already has a label and every attempt already journaled; a finished
label is never written twice, and rewritten only by ``--redo-ungradable``, which makes the labels
holding ungradable attempts again (their gradable attempts kept).
"""

from __future__ import annotations

import logging
from collections import Counter

from propel_core.execution import journal_path, label_tasks, ungradable_summary
from propel_core.provenance import holds_records
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run

log = logging.getLogger("propel")


def label(run: Run) -> None:
    """Run the solver K times on every valid task and grade each attempt -> labels.jsonl."""
    config = run.config
    tasks_path = run.input("tasks.jsonl", made_by="generate")
    tasks = [task for task in iter_jsonl(tasks_path, Task) if task.validity.valid]
    if not tasks:
        log.warning("no valid tasks in %s to label; see the generate funnel", tasks_path)
    path = run.dir / "labels.jsonl"
    run.claim("labels.jsonl", exists=holds_records(path, journal_path(path)))
    labels = label_tasks(run.services, tasks, path, run.plans.label, run.redo_ungradable)
    counts = label_counts(labels, config.label.k)
    run.track("label", counts)
    run.say(summary(counts, config.label.k))
    ungradable_summary(run.services, "label", labels)


def label_counts(labels: list[Label], k: int) -> dict[str, int]:
    """In band / outside / unknown, and how many tasks with a known utility were solved 0..K times
    (``solved_J_of_K``; a task with too few gradable attempts is unknown, not solved 0 times)."""
    utility = Counter(label.utility for label in labels)
    solved = Counter(sum(bool(a.solved) for a in label.attempts) for label in labels if label.utility is not None)
    counts = {"labeled": len(labels), "in_band": utility.get(1, 0), "outside": utility.get(0, 0)}
    counts["unknown"] = utility.get(None, 0)
    return counts | {f"solved_{j}_of_{k}": solved.get(j, 0) for j in range(k + 1)}


def summary(counts: dict[str, int], k: int) -> str:
    histogram = "  ".join(f"{j}/{k}: {counts[f'solved_{j}_of_{k}']}" for j in range(k + 1))
    return (
        f"labeled {counts['labeled']}: in band {counts['in_band']}, outside {counts['outside']}, "
        f"unknown {counts['unknown']}\nsolved  {histogram}  unknown: {counts['unknown']}"
    )
