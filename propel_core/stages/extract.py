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
    from safetensors.torch import save_file

    probe = run.config.probe
    tasks_path = run.input("tasks.jsonl", made_by="generate")
    tasks = [task for task in iter_jsonl(tasks_path, Task) if task.text is not None]
    folder = run.dir / "activations"
    reference = run.config.reference
    index = {
        "reference_model": reference.model or EMBEDDED_MODEL_ID,
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
            backend, [task.text for task in tasks], layers, poolers, turn_vector, probe.max_length,
            reference.batch_size, advance,
        )  # fmt: skip
    rows = {cell: pooled[cell] for cell in missing}

    folder.mkdir(parents=True, exist_ok=True)
    if not cached:  # another model, task set or length: nothing old is valid any more
        for old in folder.glob("*.safetensors"):
            old.unlink()
    for (layer, pooling), matrix in rows.items():
        save_file({"x": matrix.contiguous()}, activation_file(folder, layer, pooling))
    index_path.write_text(json.dumps(index))
    log.info("wrote %d activation files for %d tasks to %s", len(rows), len(tasks), folder)


def pooled_activations(backend, texts, layers, poolers, turn_vector, max_length, batch_size, advance=None):
    """``{(layer, pooling): Tensor[len(texts), dim]}`` for every layer and named pooler.

    A text is a string, pooled over its tokens, or a trajectory (a list of turns): each turn is
    pooled over its tokens by ``turn_vector``, and the named pooler then pools over the turns, with
    a turn mask, exactly as it pools over tokens. Segments are batched in length order, and padding
    never reaches a pooled vector.
    """
    import torch

    segments = [
        (owner, turn) for owner, text in enumerate(texts) for turn in ([text] if isinstance(text, str) else text)
    ]
    per_segment: dict = {}
    order = sorted(range(len(segments)), key=lambda j: len(segments[j][1]))
    done = set()
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        states = backend.hidden_states([segments[j][1] for j in batch], layers, max_length)
        for layer in layers:
            hidden = states.layers[layer]
            by_pooler = {name: pool(hidden, states.mask).float().cpu() for name, pool in poolers.items()}
            turn_rows = turn_vector(hidden, states.mask).float().cpu()
            for row, j in enumerate(batch):
                for name in poolers:
                    per_segment[layer, name, j] = by_pooler[name][row]
                per_segment[layer, None, j] = turn_rows[row]
        if advance is not None:
            finished = {segments[j][0] for j in batch} - done
            done |= finished
            advance(len(finished))
    segments_of: dict[int, list[int]] = {}
    for j, (owner, _) in enumerate(segments):
        segments_of.setdefault(owner, []).append(j)
    out = {}
    for layer in layers:
        for name, pool in poolers.items():
            vectors = []
            for owner, text in enumerate(texts):
                if isinstance(text, str):
                    vectors.append(per_segment[layer, name, segments_of[owner][0]])
                else:  # pool the turn vectors the way tokens are pooled
                    turns = torch.stack([per_segment[layer, None, j] for j in segments_of[owner]])[None]
                    vectors.append(pool(turns, torch.ones(turns.shape[:2], dtype=torch.long))[0])
            out[layer, name] = torch.stack(vectors)
    return out


def load_activations(run_dir: Path, layer: int, pooling: str):
    """The task ids and the [tasks, dim] tensor of one (layer, pooling) cell."""
    from safetensors.torch import load_file

    folder = Path(run_dir) / "activations"
    path = activation_file(folder, layer, pooling)
    if not path.exists():
        raise PropelError(f"{path} does not exist: run `propel extract` with this layer and pooling")
    return json.loads((folder / "index.json").read_text())["task_ids"], load_file(path)["x"]
