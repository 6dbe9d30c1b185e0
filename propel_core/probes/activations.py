"""Activations: the frozen reference model's hidden states, pooled per task, and the files that keep them.

One (layer, pooling) cell is one safetensors file of shape [tasks, dim] in ``RUN/activations/``;
``index.json`` maps rows to task ids. The extract stage writes them; the probe sweep, co-evolution and
the ranker read them, and a probe bundle pools new texts with :func:`pooled_activations` exactly as
extract pooled the corpus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from propel_core.errors import PropelError
from propel_core.records import Label, iter_jsonl

if TYPE_CHECKING:
    from propel_core.backend import ModelBackend
    from propel_core.contracts import Pooler


def activation_file(folder: Path, layer: int, pooling: str) -> Path:
    return folder / f"layer{layer:03d}_{pooling}.safetensors"


def pooled_activations(
    backend: ModelBackend,
    texts: list[str | list[str]],
    layers: list[int],
    poolers: dict[str, Pooler],
    turn_vector: Pooler,
    max_length: int,
    batch_size: int,
    advance=None,
):
    """``{(layer, pooling): Tensor[len(texts), dim]}`` for every layer and named pooler.

    A text is a string, pooled over its tokens, or a trajectory (a list of turns): each turn is
    pooled over its tokens by ``turn_vector``, and the named pooler then pools over the turns, with
    a turn mask, exactly as it pools over tokens. Segments are batched in length order, and padding
    never reaches a pooled vector. Pooling runs in float32 on the reference's device: a half-precision
    reference rounds its hidden states once, not again in a mean over hundreds of tokens.
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
            hidden = states.layers[layer].float()  # pooled in float32 whatever the reference's dtype
            by_pooler = {name: pool(hidden, states.mask).cpu() for name, pool in poolers.items()}
            turn_rows = turn_vector(hidden, states.mask).cpu()
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


def label_rows(ids: list[str], labels):
    """The labels that have an activation row, in task-id order whatever order the label stage finished
    them in, and the tensor of their rows in an activation matrix whose row ids are ``ids``."""
    import torch

    row_of = {task_id: row for row, task_id in enumerate(ids)}
    kept = sorted((label for label in labels if label.task_id in row_of), key=lambda label: label.task_id)
    return kept, torch.tensor([row_of[label.task_id] for label in kept], dtype=torch.long)


def labeled_rows(run_dir: Path, layer: int, pooling: str):
    """Features and labels of the labeled corpus at one cell (rows with a known utility), in task-id order."""
    import torch

    ids, x = load_activations(run_dir, layer, pooling)
    known = (label for label in iter_jsonl(Path(run_dir) / "labels.jsonl", Label) if label.utility is not None)
    labels, rows = label_rows(ids, known)
    return x[rows], torch.tensor([float(label.utility) for label in labels])
