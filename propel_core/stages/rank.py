"""rank: a Bradley-Terry reward model on the labeled corpus, or its on-policy refresh -> ``RUN/ranker/``.

The items are tasks (``rank.items: tasks``), ordered by a verifier score (``rank.score``):
``band_distance`` (minus the distance of the solve rate from the target band, 0 inside it) or
``solve_rate``; or solver attempts (``attempts``), each with a finite ``diagnostics.verifier_score``,
read as the task's text and the attempt's and paired only with attempts at the same task. The
features are the reference activations at the selected probe's cell, or, without a probe, at
``rank.layer`` and ``rank.pooling``. A random ``rank.held_out`` share of tasks is held out (of
attempts, when they are all at one task), and only pairs within each side are used, so held-out
metrics are on tasks the model never saw. With ``rank.refresh: true`` the saved ranker is refreshed
on verified pairs from the trained policy (``eval/trained/``): metrics on that policy's held-out
items are reported before and after, as the ML-engineering RL study does for its on-policy LoRA calibration. With
``rank.lora`` a LoRA on the reference trains jointly with the head, and the ranker reads the
reference with it. Either way the ranker keeps a line from its logit to the verifier score.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

from propel_core.config import ModelConfig, PropelConfig
from propel_core.embedded import EMBEDDED_MODEL_ID, model_source
from propel_core.errors import NotEnoughData, PropelError
from propel_core.probes.bundles import (
    bundle_features,
    load_head,
    read_bundle,
    reference_of,
    reference_settings,
    save_bundle,
)
from propel_core.records import Label, ProbeBundle, Task, iter_jsonl
from propel_core.run import Run
from propel_core.training.ranking import (
    fit_calibration,
    held_out_split,
    ordered_pairs,
    ranking_metrics,
    train_bradley_terry,
    train_bradley_terry_lora,
    with_lora,
)
from propel_core.training.trainer import lora_config

log = logging.getLogger("propel")


def pair_score(label: Label, config: PropelConfig) -> float:
    """The verifier score that orders pairs of tasks (``rank.score``)."""
    rate = label.solve_rate
    if config.rank.score == "solve_rate":
        return rate
    return -max(config.label.band_low - rate, rate - config.label.band_high, 0.0)


def ranked_items(labels_path: Path, config: PropelConfig) -> tuple[list[str], list[float], list[str]]:
    """The text, verifier score and task id of every item of a labels file (``rank.items``)."""
    labels = list(iter_jsonl(labels_path, Label))
    tasks = {task.id: task for task in iter_jsonl(labels_path.parent / "tasks.jsonl", Task)}
    items = []
    for label in labels:
        task = tasks.get(label.task_id)
        if task is None:
            continue
        if config.rank.items == "tasks":
            if label.solve_rate is not None:
                items.append((task.text, pair_score(label, config), task.id))
            continue
        if isinstance(task.text, list):
            raise PropelError(f"task {task.id} is a trajectory: rank.items=attempts needs tasks of one text")
        for attempt in label.attempts:
            score = attempt.diagnostics.get("verifier_score")
            if isinstance(score, int | float) and math.isfinite(score):
                items.append((f"{task.text}\n\n{attempt.text}", float(score), task.id))
    return [text for text, _, _ in items], [score for _, score, _ in items], [task for _, _, task in items]


def rank(run: Run) -> None:
    """Train (or refresh on the trained policy's items) a Bradley-Terry reward model -> ranker/."""
    import torch

    config, settings = run.config, run.config.rank
    folder, adapter = run.dir / "ranker", (run.dir / "ranker" / "adapter").resolve()
    labels_path = _labels_path(run)
    texts, score_list, tasks = ranked_items(labels_path, config)
    scores = torch.tensor(score_list)
    if len(texts) < 4 or len(scores.unique()) < 2:
        raise NotEnoughData(
            f"{len(texts)} scored {settings.items} in {labels_path} with {len(scores.unique())} distinct scores: "
            "a ranker needs at least 4 and 2 distinct scores"
        )
    by_task = settings.items == "attempts" and len(set(tasks)) > 1  # held out: whole tasks
    units = tasks if by_task else list(range(len(texts)))
    held_out, train = held_out_split(units, settings.held_out, config.seed, least=1 if by_task else 2)
    groups = tasks if settings.items == "attempts" else None
    train_pairs = ordered_pairs(train, score_list, settings.max_pairs, config.seed, groups)
    test_pairs = ordered_pairs(held_out, score_list, settings.max_pairs, config.seed, groups)
    if not train_pairs:
        raise NotEnoughData("the training items share one verifier score (per task, for attempts): no pair to learn")

    cell, start = _starting_cell(run, folder)
    reference = reference_of(cell) if cell else config.reference
    backend, lora = _reader(run, reference)
    cell = cell or _cell(config, backend)

    def read(item_texts):
        return bundle_features(backend, cell, run.registry, item_texts)

    x = read(texts)
    before = _evaluate(start, x, scores, held_out, test_pairs) if start is not None else None
    ranker, losses = start, None
    if start is None or lora is None:  # a LoRA refresh trains the saved head with the LoRA only
        ranker = train_bradley_terry(
            run.component("probe_architectures", settings.architecture),
            x,
            train_pairs,
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            epochs=settings.epochs,
            batch_size=settings.batch_size,
            seed=config.seed,
            start=start,
        )
    if lora is not None:
        with run.progress("rank: LoRA steps", total=settings.lora_steps) as advance:
            losses = train_bradley_terry_lora(
                lora,
                read,
                ranker,
                texts,
                train_pairs,
                lr=settings.lora_lr,
                steps=settings.lora_steps,
                batch_pairs=settings.lora_batch_pairs,
                seed=config.seed,
                advance=advance,
            )
        log.info("LoRA: loss %.4f at the first step, %.4f at the last", losses[0], losses[-1])
        lora.save_pretrained(str(adapter))
        reference = reference.with_adapter(adapter)
        x = read(texts)  # what the ranker reads now
    elif not settings.refresh:
        shutil.rmtree(adapter, ignore_errors=True)  # an older LoRA ranker's
    after = _evaluate(ranker, x, scores, held_out, test_pairs)
    architecture = settings.architecture if start is None else cell.architecture
    _save(folder, ranker, cell, architecture, reference, x[train], scores[train], after)
    counts = {"count": len(texts), "train_pairs": len(train_pairs), "held_out_pairs": len(test_pairs)}
    _report(run, folder, counts, losses, before, after)


def _save(folder: Path, ranker, cell: ProbeBundle, architecture: str, reference, x, scores, after: dict) -> None:
    """The ranker as a probe bundle in ``folder``: read at ``cell``'s layer and pooling by ``reference``
    (with its LoRA, if any), calibrated to the verifier's scale on its training rows ``x``, ``scores``."""
    description = cell.model_copy(
        update={
            "architecture": architecture,
            "reference": reference_settings(reference),
            "input_dim": x.shape[1],
            "temperature": 1.0,
            "training_rows": len(x),
            "metrics": {k: v for k, v in after.items() if v == v},
            "calibration": fit_calibration(ranker.logits(x), scores),
            "lowest_valid_logit": ranker.lowest_logit(x),  # over the items it ranked (a rule paid in its logits)
        }
    )
    save_bundle(folder, ranker, description)


def _report(run: Run, folder: Path, counts: dict[str, int], losses, before, after) -> None:
    """``metrics.json`` (``refresh.json`` for a refresh): the ranker's held-out metrics after training
    (and before, for a refresh), its counts and the LoRA's losses; tracked and said."""
    settings = run.config.rank
    summary = {
        "items": settings.items,
        **counts,
        "refresh": settings.refresh,
        "lora": settings.lora,
        "lora_losses": losses,
        "before": before,
        "after": after,
    }
    (folder / ("refresh.json" if settings.refresh else "metrics.json")).write_text(json.dumps(summary, indent=2))
    log.info("ranker on %d %s, %d training pairs", counts["count"], settings.items, counts["train_pairs"])
    run.track("rank", {("refresh/" if settings.refresh else "") + key: value for key, value in after.items()})
    for name, values in (("before refresh", before), ("held out", after)):
        if values:
            run.say(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()))


def _labels_path(run: Run) -> Path:
    """The labels the ranker learns from: ``rank.labels``, else the trained policy's (a refresh), else
    the run's corpus."""
    settings = run.config.rank
    if settings.labels is None:
        return (
            run.input("eval/trained/labels.jsonl", "evaluate")
            if settings.refresh
            else run.input("labels.jsonl", "label")
        )
    labels_path = run.dir / settings.labels  # an absolute path stays itself
    if not labels_path.is_file() or not (labels_path.parent / "tasks.jsonl").is_file():
        raise PropelError(f"rank.labels: {labels_path} is not a labels file with a tasks.jsonl beside it")
    return labels_path


def _starting_cell(run: Run, folder: Path):
    """The cell the ranker reads and the head it starts from: a refresh's saved ranker, else the
    selected probe's cell and a fresh head, else none yet (``_cell`` picks one)."""
    if run.config.rank.refresh:
        if not (folder / "probe.json").exists():
            raise PropelError(f"no ranker in {folder} to refresh: run `propel rank` with rank.refresh=false first")
        cell = read_bundle(folder)
        return cell, load_head(folder, cell, run.registry)
    selected = run.dir / "probes" / "selected"
    return (read_bundle(selected) if selected.exists() else None), None


def _reader(run: Run, reference: ModelConfig):
    """The backend that reads items for the ranker, and with ``rank.lora`` the LoRA it trains in its own
    copy of the reference (None without)."""
    config, settings = run.config, run.config.rank
    if not settings.lora:
        return run.registry.backend(reference), None
    if reference.backend != "transformers":
        raise PropelError("rank.lora trains the reference's weights: give the reference the transformers backend")
    if reference.adapter and not settings.refresh:
        raise PropelError(f"rank.lora trains a new adapter: the reference already carries {reference.adapter}")
    factory = run.component("model_backends", reference.backend)  # its own copy, not the shared one
    backend = factory(reference.with_adapter(None), **reference.options)
    adapter = lora_config(config.lora, r=settings.lora_r, alpha=settings.lora_alpha)
    return backend, with_lora(backend.model, reference.adapter, adapter, config.seed)


def _cell(config: PropelConfig, backend) -> ProbeBundle:
    """Where a ranker without a selected probe reads the reference: ``rank.layer`` (null: the middle
    one) and ``rank.pooling``, with the probe sweep's length and turn vector."""
    reference, layer = config.reference, config.rank.layer
    if layer is None:
        if not hasattr(backend, "num_layers"):
            raise PropelError(f"the {reference.backend} backend does not say how deep the reference is: set rank.layer")
        layer = backend.num_layers // 2
    return ProbeBundle(
        reference_model=reference.model or EMBEDDED_MODEL_ID,
        reference=reference_settings(reference),
        reference_source=model_source(reference.model, reference.revision),
        layer=layer,
        pooling=config.rank.pooling,
        architecture=config.rank.architecture,
        input_dim=0,  # known once the features are read
        max_length=config.probe.max_length,
        turn_vector=config.probe.turn_vector,
        training_rows=0,
    )


def _evaluate(ranker, x, scores, rows, pairs) -> dict[str, float]:
    model_scores = ranker.logits(x)
    position = {row: i for i, row in enumerate(rows)}
    local_pairs = [(position[i], position[j]) for i, j in pairs]
    return ranking_metrics(model_scores[rows], scores[rows], local_pairs)
