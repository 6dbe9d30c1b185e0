"""A run's tasks and labels as one Hugging Face dataset (``propel export``).

``datasets`` also reads the run's JSONL files as they are (``load_dataset("json", data_files=...)``);
the export gives them one flat, typed shape instead: one split per task file (``corpus`` from
``RUN/tasks.jsonl``, ``eval_ARM`` from each ``RUN/eval/ARM/tasks.jsonl``), one row per task with its
label joined in (empty where the task has none), nested data as JSON text. Arrow's strings must be
valid UTF-8, so every string field is exported ``readable``: where a model wrote what is not (a lone
surrogate), ``\\u`` escapes stand in its place; the run's own files keep it exactly.
"""

from __future__ import annotations

from pathlib import Path

from propel_core.errors import PropelError
from propel_core.records import Label, Task, iter_jsonl, readable, to_json


def task_files(run_dir: Path) -> dict[str, Path]:
    """Split name -> the task file it comes from, for every task file the run folder holds."""
    found = {"corpus": run_dir / "tasks.jsonl"} if (run_dir / "tasks.jsonl").exists() else {}
    for path in sorted((run_dir / "eval").glob("*/tasks.jsonl")):
        found[f"eval_{path.parent.name}"] = path
    return found


def rows(tasks: Path) -> list[dict]:
    """One flat row per task of ``tasks``, with the label of the ``labels.jsonl`` beside it."""
    labels = {label.task_id: label for label in iter_jsonl(tasks.parent / "labels.jsonl", Label)}
    out = []
    for task in iter_jsonl(tasks, Task):
        label = labels.get(task.id)
        out.append(
            readable(
                {
                    "id": task.id,
                    "domain": task.domain,
                    "context_id": task.context_id,
                    "generator": task.generator,
                    "generation": task.generation,
                    "text": to_json(task.text) if isinstance(task.text, list) else task.text,
                    "payload": None if task.payload is None else to_json(task.payload),
                    "valid": task.validity.valid,
                    "rejection": task.validity.reason,
                    "topic": task.topic,
                    "labeled": label is not None,
                    "solved": [a.solved for a in label.attempts] if label else [],
                    "solve_rate": label.solve_rate if label else None,
                    "utility": label.utility if label else None,
                    "band": list(label.band) if label else [],
                }
            )
        )
    return out


def export(run_dir: Path, to: Path) -> dict[str, int]:
    """Write the run's task files as a ``DatasetDict`` to ``to`` (``datasets.load_from_disk`` reads it);
    returns the rows per split."""
    from datasets import Dataset, DatasetDict

    run_dir = Path(run_dir)
    if readable(str(to)) != str(to):
        raise PropelError(f"--to {readable(str(to))} is not valid UTF-8, which Arrow needs of a folder name")
    files = task_files(run_dir)
    if not files:
        raise PropelError(f"{run_dir} holds no tasks.jsonl to export: run `propel generate` first")
    splits = {name: Dataset.from_list(rows(path)) for name, path in files.items()}
    DatasetDict(splits).save_to_disk(str(to))
    return {name: len(split) for name, split in splits.items()}
