"""extract: the frozen reference model reads every rendered task once -> ``RUN/activations/``.

One forward pass per batch gives the hidden states of every layer in the sweep; blocks above the
deepest one are not run. Batches are built from tasks sorted by length, so little compute goes into
padding, and poolers see the attention mask, so padding never reaches a pooled vector. Each
(layer, pooling) pair is one safetensors file of shape [tasks, dim], rows in task-id order;
``index.json`` maps rows to task ids. A rerun with the same reference model (all its settings but
batch size), tasks and length limit reuses every file it finds.
"""

from __future__ import annotations

import json
import logging

from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.errors import PropelError
from propel_core.probes.activations import activation_file, pooled_activations
from propel_core.probes.bundles import reference_settings
from propel_core.records import Task, iter_jsonl
from propel_core.run import Run

log = logging.getLogger("propel")


def extract(run: Run) -> None:
    """Pool the frozen reference model's hidden states for every rendered task -> activations/."""
    from safetensors.torch import save_file

    probe = run.config.probe
    tasks_path = run.input("tasks.jsonl", made_by="generate")
    by_id: dict[str, Task] = {}
    for task in iter_jsonl(tasks_path, Task):
        if task.text is None:
            continue
        if by_id.setdefault(task.id, task).text != task.text:
            raise PropelError(
                f"{tasks_path} holds two different tasks with the id {task.id}: did two runs write into "
                "one folder? Generate into a fresh run_dir"
            )
    # in task-id order, not the file's (generation finishes tasks in any order): the same rows, batches
    # and sums however the corpus was written
    tasks = [by_id[task_id] for task_id in sorted(by_id)]
    folder = run.dir / "activations"
    reference = run.config.reference
    index = {
        "reference_model": reference.model or EMBEDDED_MODEL_ID,
        "reference": {k: v for k, v in reference_settings(reference).items() if k != "batch_size"},
        "max_length": probe.max_length,
        "turn_vector": probe.turn_vector,
        "task_ids": [task.id for task in tasks],
    }
    index_path = folder / "index.json"
    cached = index_path.exists() and json.loads(index_path.read_text()) == index
    wanted = [(layer, pooling) for layer in probe.layers for pooling in probe.poolings]
    missing = [cell for cell in wanted if not (cached and activation_file(folder, *cell).exists())]
    if not missing:
        log.info("activations for %d tasks are cached in %s", len(tasks), folder)
        return
    if not tasks:
        raise PropelError(f"no parsed tasks in {tasks_path} to extract activations from")

    backend = run.backend("reference")
    poolers = {pooling: run.component("poolers", pooling) for _, pooling in missing}
    turn_vector = run.component("poolers", probe.turn_vector)
    layers = sorted({layer for layer, _ in missing})
    with run.progress("extract", total=len(tasks)) as advance:
        pooled = pooled_activations(
            backend,
            [task.text for task in tasks],
            layers,
            poolers,
            turn_vector,
            probe.max_length,
            reference.batch_size,
            advance,
        )
    rows = {cell: pooled[cell] for cell in missing}

    folder.mkdir(parents=True, exist_ok=True)
    if not cached:  # another model, task set or length: nothing old is valid any more
        for old in folder.glob("*.safetensors"):
            old.unlink()
    for (layer, pooling), matrix in rows.items():
        save_file({"x": matrix.contiguous()}, activation_file(folder, layer, pooling))
    index_path.write_text(json.dumps(index))
    log.info("wrote %d activation files for %d tasks to %s", len(rows), len(tasks), folder)
