"""Sweep cells: the train/validation splits of one (layer, pooling, architecture, balance) cell, and
the probes fitted at a chosen cell (co-evolution's auxiliary probe, the ensemble)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

from propel_core.config import ProbeConfig
from propel_core.errors import PropelError
from propel_core.probes.activations import labeled_rows
from propel_core.probes.bundles import read_bundle, save_bundle
from propel_core.probes.heads import fit_temperature, train_probe
from propel_core.probes.metrics import metrics
from propel_core.records import ProbeBundle

log = logging.getLogger("propel")


def splits(y, groups, balance: str, split: str, config: ProbeConfig, seed: int) -> Iterator[tuple]:
    """(train, val, test) row indices: a random 80/10/10 split, or k grouped folds (test = one fold,
    val = the next, train = the rest; no group straddles two folds). ``downsample`` first drops
    majority-class rows at random until both classes are the same size."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    chosen = torch.arange(len(y))
    if balance == "downsample":
        positives, negatives = chosen[y == 1], chosen[y == 0]
        keep = min(len(positives), len(negatives))
        pick = lambda rows: rows[torch.randperm(len(rows), generator=generator)[:keep]]  # noqa: E731
        chosen = torch.cat([pick(positives), pick(negatives)])
    if split == "random":
        if len(chosen) < 10:
            raise PropelError(f"{len(chosen)} rows after balancing; an 80/10/10 split needs at least 10")
        chosen = chosen[torch.randperm(len(chosen), generator=generator)]
        n_train, n_val = int(0.8 * len(chosen)), max(1, int(0.1 * len(chosen)))
        yield chosen[:n_train], chosen[n_train : n_train + n_val], chosen[n_train + n_val :]
        return
    names = sorted({groups[i] for i in chosen.tolist()})
    if len(names) < config.folds:
        raise PropelError(f"grouped k-fold needs at least {config.folds} groups; the labeled rows have {len(names)}")
    order = torch.randperm(len(names), generator=generator).tolist()
    fold_of = {names[i]: position % config.folds for position, i in enumerate(order)}
    folds = [chosen[torch.tensor([fold_of[groups[i]] == f for i in chosen.tolist()])] for f in range(config.folds)]
    for f in range(config.folds):
        val_fold = (f + 1) % config.folds
        train = torch.cat([folds[g] for g in range(config.folds) if g not in (f, val_fold)])
        yield train, folds[val_fold], folds[f]


def fit_at_cell(registry, folder: Path, bundle: ProbeBundle, x, y, config: ProbeConfig, seed: int, source: str) -> Path:
    """Train one probe of ``bundle``'s architecture on (x, y) (a random 80/10/10 split, classes
    weighted), log its test balanced accuracy, and save it as a bundle like ``bundle`` in ``folder``."""
    import torch

    train, val, test = next(splits(y, [str(i) for i in range(len(y))], "weighted", "random", config, seed))
    factory = registry.get("probe_architectures", bundle.architecture)
    trained = train_probe(factory, x, y, train, val, config, True, seed)
    temperature = fit_temperature(trained.logits(x[val]), y[val]) if config.calibrate else 1.0
    scores = metrics(y[test], trained.logits(x[test]), torch.zeros(len(test)))
    log.info("%s: %d rows, test balanced accuracy %.3f", source, len(y), scores["balanced_accuracy"])
    finite = {k: v for k, v in scores.items() if math.isfinite(v)}
    lowest = trained.lowest_logit(x, temperature)
    update = {"temperature": temperature, "training_rows": len(train), "metrics": finite, "lowest_valid_logit": lowest}
    description = bundle.model_copy(update=update)
    save_bundle(folder, trained, description)
    return folder


def ensemble_probes(registry, run_dir: Path, config: ProbeConfig, seed: int, size: int, folder: Path) -> list[Path]:
    """The ``wco`` rule's ensemble beside the selected probe: ``size - 1`` more probes at its cell,
    seeded ``seed + 1`` on, trained on the labeled corpus -> ``folder/seed-S``."""
    bundle = read_bundle(Path(run_dir) / "probes" / "selected")
    x, y = labeled_rows(run_dir, bundle.layer, bundle.pooling)
    return [
        fit_at_cell(registry, folder / f"seed-{s}", bundle, x, y, config, s, f"ensemble member, seed {s}")
        for s in range(seed + 1, seed + size)
    ]
