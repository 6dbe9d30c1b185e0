"""The probe sweep (appendix 14): layer x pooling x architecture x balance on the labeled activations,
each cell measured over seeds and folds, one cell selected, and what the sweep leaves beside the
selected probe (the table of cells, its heatmap, the selected probe's reliability diagram).

All heads of a group of feature matrices (every cell x seed x fold on them) train at once, stacked
(:func:`propel_core.probes.heads.train_probes`); each gets what training it alone gives.

Selection: among cells whose validation ECE is at most ``probe.max_ece`` (all cells when none is),
take those within ``probe.rvp_tolerance`` of the best validation balanced accuracy and pick the one
with the highest RVP, the variance of the exact RL reward over base-policy generations.
"""

from __future__ import annotations

import csv
import logging
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from propel_core.contracts import RewardRule
from propel_core.embedded import EMBEDDED_MODEL_ID, model_source
from propel_core.errors import NotEnoughData, PropelError, RewardError
from propel_core.probes.activations import label_rows, load_activations
from propel_core.probes.bundles import reference_settings, save_bundle
from propel_core.probes.cells import splits
from propel_core.probes.heads import ProbeJob, fit_temperature, train_probes
from propel_core.probes.metrics import calibration_bins, metrics
from propel_core.records import Label, ProbeBundle, Task, iter_jsonl

if TYPE_CHECKING:
    from propel_core.plans import SweepPlan
    from propel_core.services import Services

log = logging.getLogger("propel")

FEATURE_BYTES = 512 << 20  # feature matrices whose heads train together (they are copied once more)


@dataclass(frozen=True)
class Sweep:
    """What a sweep found: one row per cell (its settings, and each metric's mean over the cell's
    seeds and folds), each cell's first head with the features and split it was measured on, and the
    labels (in band or not) of the activation rows."""

    cells: list[dict]
    heads: dict[tuple, tuple]  # (layer, pooling, architecture, balance) -> (trained, x, val, test)
    y: Any  # Tensor[rows]


def known_labels(path: Path) -> list[Label]:
    """The labels in ``path`` with a known utility, refused when there are none or all are on one side."""
    labels = [label for label in iter_jsonl(path, Label) if label.utility is not None]
    if not labels:
        raise PropelError(f"no labels with a known utility in {path}: run `propel label` first")
    if len({label.utility for label in labels}) < 2:
        side = "inside" if labels[0].utility else "outside"
        raise NotEnoughData(
            f"all {len(labels)} labeled tasks are {side} the band, so there is nothing to tell apart; "
            "label more tasks, or move label.band_low / label.band_high"
        )
    return labels


def sweep(
    services: Services,
    plan: SweepPlan,
    labels: list[Label],
    tasks: dict[str, Task],
    rule_at: Callable[[float], RewardRule],
) -> Sweep:
    """Every cell of the plan's sweep (its ``probe`` section) on the activations in the run folder,
    measured on ``labels`` of ``tasks``; RVP pays each head by ``rule_at(its lowest valid logit)``
    (``rule_of_cell(services, plan.reward)``)."""
    import torch

    config = plan.probe
    ids, first = load_activations(services.dir, config.layers[0], config.poolings[0])
    _refuse_stale(services.dir, ids, tasks)
    labels, rows = label_rows(ids, labels)
    row_of = {task_id: row for row, task_id in enumerate(ids)}
    y = torch.tensor([label.utility for label in labels])
    solve_rates = torch.tensor([label.solve_rate for label in labels], dtype=torch.float)
    groups = [tasks[label.task_id].context_id for label in labels]
    rvp_tasks = [tasks[task_id] for task_id in sorted(tasks)][: config.rvp_samples]
    log.info("%d labeled rows (%d in band); RVP over %d base-policy tasks", len(y), int(y.sum()), len(rvp_tasks))

    pairs = [(architecture, balance) for architecture in config.architectures for balance in config.balance]
    matrices = [(layer, pooling) for layer in config.layers for pooling in config.poolings]
    factories = {
        architecture: services.registry.get("probe_architectures", architecture)
        for architecture in config.architectures
    }
    split_of = {
        (balance, seed): list(splits(y, groups, balance, config.split, config, seed))
        for balance in config.balance
        for seed in config.seeds
    }
    # the heads each feature matrix gets: architecture x balance x seed x fold
    heads = [
        (architecture, balance, seed, split)
        for architecture, balance in pairs
        for seed in config.seeds
        for split in split_of[balance, seed]
    ]
    # every head of a group of feature matrices trains at once, as many matrices a group as fit in FEATURE_BYTES
    per_group = max(1, FEATURE_BYTES // max(1, len(rows) * first.shape[1] * first.element_size()))
    del first
    results: dict[tuple, list] = {}
    kept = {}
    with services.progress("probe sweep", total=len(matrices) * len(pairs)) as advance:
        for start in range(0, len(matrices), per_group):
            jobs, where, rvp_x = [], [], {}
            for layer, pooling in matrices[start : start + per_group]:
                _, x_all = load_activations(services.dir, layer, pooling)
                x = x_all[rows]
                rvp_x[layer, pooling] = {t.id: x_all[row_of[t.id]].clone() for t in rvp_tasks if t.id in row_of}
                del x_all  # only the labeled rows stay (a row of it, not cloned, would keep all of it)
                for architecture, balance, seed, (train, val, test) in heads:
                    jobs.append(ProbeJob(factories[architecture], x, train, val, balance == "weighted", seed))
                    where.append((layer, pooling, architecture, balance, val, test))
            trained_heads = train_probes(jobs, y, config, _cells_done(where, advance))
            for job, (*cell, val, test), trained in zip(jobs, where, trained_heads, strict=True):
                x, features = job.x, rvp_x[cell[0], cell[1]]
                result = {f"val_{k}": v for k, v in metrics(y[val], trained.logits(x[val]), solve_rates[val]).items()}
                result |= {
                    f"test_{k}": v for k, v in metrics(y[test], trained.logits(x[test]), solve_rates[test]).items()
                }
                result |= {
                    "rvp": rvp(rule_at, rvp_tasks, features, trained, x),
                    "epochs": trained.epochs,
                    "train_rows": len(job.train),
                    "val_rows": len(val),
                    "test_rows": len(test),
                    "rvp_rows": len(features),
                }
                results.setdefault(tuple(cell), []).append(result)
                kept.setdefault(tuple(cell), (trained, x, val, test))
    return Sweep(_cells(results, matrices, pairs), kept, y)


def _refuse_stale(run_dir: Path, ids: list[str], tasks: dict[str, Task]) -> None:
    """Activations must read tasks that ``tasks.jsonl`` still holds; else extract has to run again."""
    stale = [task_id for task_id in ids if task_id not in tasks]
    if stale:
        raise PropelError(
            f"the activations in {run_dir / 'activations'} read {len(stale)} tasks that {run_dir / 'tasks.jsonl'} "
            f"no longer holds (e.g. {stale[0]}): run `propel extract` again"
        )


def _cells(results: dict, matrices, pairs) -> list[dict]:
    """One row per cell of the sweep: its settings and the mean of each metric over its seeds."""
    cells = []
    for layer, pooling in matrices:
        for architecture, balance in pairs:
            runs = results[layer, pooling, architecture, balance]
            cell = {"layer": layer, "pooling": pooling, "architecture": architecture, "balance": balance}
            cells.append(cell | {key: _mean([r[key] for r in runs]) for key in runs[0]})
    return cells


def save_selected(folder: Path, found: Sweep, chosen: dict, plan: SweepPlan) -> None:
    """The chosen cell's head as ``folder/selected`` (temperature-scaled with ``probe.calibrate``), read
    from the plan's reference model, and its reliability diagram on the held-out rows."""
    import torch

    config, reference = plan.probe, plan.reference
    trained, x, val, test = found.heads[chosen["layer"], chosen["pooling"], chosen["architecture"], chosen["balance"]]
    y = found.y
    temperature = fit_temperature(trained.logits(x[val]), y[val]) if config.calibrate else 1.0
    held_out = torch.cat([val, test])
    probabilities = torch.sigmoid(trained.logits(x[held_out]) / temperature)
    rows = f"{len(val)} validation + {len(test)} test rows of its split"
    reliability(folder / "reliability.png", y[held_out], probabilities, rows)
    bundle = ProbeBundle(
        reference_model=reference.model or EMBEDDED_MODEL_ID,
        reference=reference_settings(reference),
        reference_source=model_source(reference.model, reference.revision),
        layer=chosen["layer"],
        pooling=chosen["pooling"],
        architecture=chosen["architecture"],
        input_dim=x.shape[1],
        max_length=config.max_length,
        turn_vector=config.turn_vector,
        temperature=temperature,
        training_rows=int(chosen["train_rows"]),
        lowest_valid_logit=trained.lowest_logit(x, temperature),
        metrics={k: v for k, v in chosen.items() if isinstance(v, float) and math.isfinite(v)},
    )
    save_bundle(folder / "selected", trained, bundle)


def _cells_done(where: list[tuple], advance):
    """A ``finished(job)`` callback that advances the progress bar as the last head of a cell is done."""
    waiting = Counter(cell[:4] for cell in where)

    def finished(i: int) -> None:
        waiting[where[i][:4]] -= 1
        if not waiting[where[i][:4]]:
            advance(1)

    return finished


def rvp(rule_at, tasks: list[Task], features: dict, trained, labeled) -> float:
    """Reward variance under the base policy: the exact RL reward of each base-policy task, whose
    probe scores come from its activations (tasks that never parsed have none), under ``rule_at``
    settled at the lowest logit the head gives a ``labeled`` row (NaN for a head that diverged)."""
    import torch

    lowest = trained.lowest_logit(labeled)
    if not math.isfinite(lowest):
        return math.nan
    rule = rule_at(lowest)

    scored = [t.id for t in tasks if t.id in features]
    logits = (
        dict(zip(scored, trained.logits(torch.stack([features[i] for i in scored])).tolist(), strict=True))
        if scored
        else {}
    )
    rewards = []
    for task in tasks:
        scores = {}
        if task.id in logits:
            logit = logits[task.id]
            scores = {
                "logit": logit,
                "probability": 1 / (1 + math.exp(-logit)),
                "ensemble_logits": [logit],
                "auxiliary_logit": logit,
            }
        try:
            rewards.append(rule(task, scores))
        except RewardError:  # e.g. probe_only on a task that never parsed: no reward to count
            continue
    return statistics.pvariance(rewards) if len(rewards) > 1 else 0.0


def select(cells: list[dict], config) -> dict:
    calibrated = [c for c in cells if c["val_ece"] <= config.max_ece]
    if not calibrated:
        log.warning("no cell has validation ECE <= %s; selecting among all cells", config.max_ece)
    pool = calibrated or cells
    best = max(c["val_balanced_accuracy"] for c in pool)
    close = [c for c in pool if c["val_balanced_accuracy"] >= best - config.rvp_tolerance]
    return max(close, key=lambda c: (c["rvp"], c["val_balanced_accuracy"]))


def write_sweep(path, cells: list[dict]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(cells[0]))
        writer.writeheader()
        writer.writerows(cells)


def heatmap(path, cells: list[dict], config) -> None:
    """Validation balanced accuracy per layer x pooling; one panel per architecture x balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(a, b) for a in config.architectures for b in config.balance]
    size = (2 + 1.4 * len(config.poolings) * len(panels), 1 + 0.5 * len(config.layers))
    figure, axes = plt.subplots(1, len(panels), figsize=size, squeeze=False)
    by_cell = {(c["layer"], c["pooling"], c["architecture"], c["balance"]): c["val_balanced_accuracy"] for c in cells}
    top = max(0.8, *by_cell.values())  # chance at the bottom of the colour scale, the best cell at the top
    for axis, (architecture, balance) in zip(axes[0], panels, strict=True):
        grid = [
            [by_cell[layer, pooling, architecture, balance] for pooling in config.poolings] for layer in config.layers
        ]
        image = axis.imshow(grid, vmin=0.5, vmax=top, cmap="viridis", aspect="auto")
        axis.set_xticks(range(len(config.poolings)), config.poolings, rotation=45, ha="right")
        axis.set_yticks(range(len(config.layers)), config.layers)
        axis.set_title(f"{architecture}, {balance}")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                axis.text(j, i, f"{value:.2f}", ha="center", va="center", color="white" if value < 0.6 else "black")
    axes[0][0].set_ylabel("layer")
    figure.colorbar(image, ax=axes[0].tolist(), label="validation balanced accuracy")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def reliability(path, y, probabilities, rows: str, bins: int = 10) -> None:
    """Reliability diagram of the selected probe on its held-out rows (``rows`` says which): in-band rate
    per probability bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = calibration_bins(y, probabilities, bins)
    centers, rates, counts = ([row[i] for row in found] for i in range(3))
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    axis.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect calibration")
    axis.scatter(centers, rates, s=[20 + 8 * c for c in counts], label="bins (size = rows)")
    axis.plot(centers, rates)
    axis.set_xlim(0, 1)
    axis.set_ylim(0, 1)
    axis.set_xlabel("calibrated probe probability")
    axis.set_ylabel("in-band rate")
    axis.set_title(f"selected probe: {rows}", fontsize=9)
    axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def selection_table(cells: list[dict], chosen: dict) -> str:
    """The five best cells by validation balanced accuracy (and the chosen one, where it is not among
    them), in columns as wide as their longest entry (a plugin's architecture may have a long name)."""
    ranked = sorted(cells, key=lambda c: -c["val_balanced_accuracy"])[:5]
    header = ("layer", "pooling", "arch", "balance", "val bacc", "val ece", "test bacc", "rvp")
    rows = [
        (
            str(c["layer"]),
            c["pooling"],
            c["architecture"],
            c["balance"],
            f"{c['val_balanced_accuracy']:.3f}",
            f"{c['val_ece']:.3f}",
            f"{c['test_balanced_accuracy']:.3f}",
            f"{c['rvp']:.4f}",
            "  <- selected" if c is chosen else "",
        )
        for c in [*ranked, *([chosen] if chosen not in ranked else [])]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row) -> str:
        texts = zip(row[: len(header)], widths, strict=True)
        cells = [text.ljust(width) if i in (1, 2, 3) else text.rjust(width) for i, (text, width) in enumerate(texts)]
        return "  " + " ".join(cells) + "".join(row[len(header) :])

    return "\n".join([f"{len(cells)} cells; top by validation balanced accuracy:", line(header), *map(line, rows)])


def _mean(values: list) -> float:
    finite = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
