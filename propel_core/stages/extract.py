"""extract: the frozen reference model reads every rendered task once -> ``RUN/activations/``.

One forward pass per batch gives the hidden states of every layer in the sweep; blocks above the
deepest one are not run. Batches are built from tasks sorted by length, so little compute goes into
padding, and poolers see the attention mask, so padding never reaches a pooled vector. Each
(layer, pooling) pair is one safetensors file of shape [tasks, dim]; ``index.json`` maps rows to task
ids. A rerun with the same reference model, tasks and length limit reuses every file it finds.
"""

from __future__ import annotations

import json
from pathlib import Path

from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.errors import PropelError
from propel_core.records import Task, iter_jsonl
from propel_core.run import Run, log


def activation_file(folder: Path, layer: int, pooling: str) -> Path:
    return folder / f"layer{layer:03d}_{pooling}.safetensors"


def extract(run: Run) -> None:
    """Pool the frozen reference model's hidden states for every rendered task -> activations/."""
    import torch
    from safetensors.torch import save_file

    probe = run.config.probe
    tasks_path = run.dir / "tasks.jsonl"
    if not tasks_path.exists():
        raise PropelError(f"{tasks_path} does not exist: run `propel generate` first")
    tasks = [task for task in iter_jsonl(tasks_path, Task) if task.text is not None]
    folder = run.dir / "activations"
    reference = run.config.reference
    index = {
        "reference_model": reference.model or EMBEDDED_MODEL_ID,
        "max_length": probe.max_length,
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
    layers = sorted({layer for layer, _ in missing})
    order = sorted(range(len(tasks)), key=lambda i: len(tasks[i].text))
    rows: dict[tuple[int, str], list] = {key: [None] * len(tasks) for key in missing}
    with run.progress("extract", total=len(tasks)) as advance:
        for start in range(0, len(order), reference.batch_size):
            batch = order[start : start + reference.batch_size]
            states = backend.hidden_states([tasks[i].text for i in batch], layers, probe.max_length)
            for layer, pooling in missing:
                pooled = poolers[pooling](states.layers[layer], states.mask).float().cpu()
                for row, i in enumerate(batch):
                    rows[layer, pooling][i] = pooled[row]
            advance(len(batch))

    folder.mkdir(parents=True, exist_ok=True)
    if not cached:  # another model, task set or length: nothing old is valid any more
        for old in folder.glob("*.safetensors"):
            old.unlink()
    for (layer, pooling), vectors in rows.items():
        save_file({"x": torch.stack(vectors).contiguous()}, activation_file(folder, layer, pooling))
    index_path.write_text(json.dumps(index))
    log.info("wrote %d activation files for %d tasks to %s", len(rows), len(tasks), folder)


def load_activations(run_dir: Path, layer: int, pooling: str):
    """The task ids and the [tasks, dim] tensor of one (layer, pooling) cell."""
    from safetensors.torch import load_file

    folder = Path(run_dir) / "activations"
    path = activation_file(folder, layer, pooling)
    if not path.exists():
        raise PropelError(f"{path} does not exist: run `propel extract` with this layer and pooling")
    return json.loads((folder / "index.json").read_text())["task_ids"], load_file(path)["x"]
