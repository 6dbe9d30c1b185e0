"""rank: a Bradley-Terry reward model on the labeled corpus, or its on-policy refresh -> ``RUN/ranker/``.

Tasks are ordered by a verifier score (``rank.score``): ``band_distance`` (minus the distance of the
solve rate from the target band, 0 inside it) or ``solve_rate``. The features are the reference
activations at the selected probe's cell (``propel extract`` wrote them). A random ``rank.held_out``
share of tasks is held out, and only pairs within each side are used, so held-out metrics are on
tasks the model never saw. With ``rank.refresh: true`` the saved ranker is refreshed on verified
pairs from the trained policy (``eval/trained/``): metrics on that policy's held-out tasks are
reported before and after, as seed 002 does for its on-policy LoRA calibration.
"""

from __future__ import annotations

import json
import random

from propel_core.config import PropelConfig
from propel_core.errors import NotEnoughData, PropelError
from propel_core.probes import load_probe, save_bundle
from propel_core.ranking import ordered_pairs, ranking_metrics, train_bradley_terry
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run, log


def pair_score(label: Label, config: PropelConfig) -> float:
    """The verifier score that orders pairs (``rank.score``)."""
    rate = label.solve_rate
    if config.rank.score == "solve_rate":
        return rate
    return -max(config.label.band_low - rate, rate - config.label.band_high, 0.0)


def rank(run: Run) -> None:
    """Train (or refresh on the trained policy's tasks) a Bradley-Terry reward model -> ranker/."""
    import torch

    config = run.config
    folder = run.dir / "ranker"
    probe = load_probe(run.input("probes/selected", made_by="probe"), run.registry)
    name, made_by = ("eval/trained/labels.jsonl", "evaluate") if config.rank.refresh else ("labels.jsonl", "label")
    source = run.input(name, made_by).parent
    labels = [label for label in iter_jsonl(source / "labels.jsonl", Label) if label.solve_rate is not None]
    tasks = {task.id: task for task in iter_jsonl(source / "tasks.jsonl", Task)}
    labels = [label for label in labels if label.task_id in tasks]
    scores = torch.tensor([pair_score(label, config) for label in labels])
    if len(labels) < 4 or len(scores.unique()) < 2:
        raise NotEnoughData(
            f"{len(labels)} labeled tasks in {source} with {len(scores.unique())} distinct scores: "
            "a ranker needs at least 4 tasks and 2 distinct scores"
        )
    x = probe.features([tasks[label.task_id].text for label in labels])
    order = list(range(len(labels)))
    random.Random(config.seed).shuffle(order)
    cut = max(2, round(len(order) * config.rank.held_out))
    held_out, train = sorted(order[:cut]), sorted(order[cut:])
    train_pairs = ordered_pairs(train, scores.tolist(), config.rank.max_pairs, config.seed)
    test_pairs = ordered_pairs(held_out, scores.tolist(), config.rank.max_pairs, config.seed)
    if not train_pairs:
        raise NotEnoughData("the training tasks all share one verifier score: no ordered pair to learn from")
    start, before = None, None
    if config.rank.refresh:
        if not (folder / "probe.json").exists():
            raise PropelError(f"no ranker in {folder} to refresh: run `propel rank` with rank.refresh=false first")
        start = load_probe(folder, run.registry).probe
        before = _evaluate(start, x, scores, held_out, test_pairs)
    ranker = train_bradley_terry(
        run.component("probe_architectures", config.rank.architecture),
        x,
        train_pairs,
        lr=config.rank.lr,
        weight_decay=config.rank.weight_decay,
        epochs=config.rank.epochs,
        batch_size=config.rank.batch_size,
        seed=config.seed,
        start=start,
    )
    after = _evaluate(ranker, x, scores, held_out, test_pairs)
    description = probe.bundle.model_copy(
        update={
            "architecture": config.rank.architecture,
            "temperature": 1.0,
            "training_rows": len(train),
            "metrics": {k: v for k, v in after.items() if v == v},
        }
    )
    save_bundle(folder, ranker, description)
    summary = {
        "tasks": len(labels),
        "train_pairs": len(train_pairs),
        "held_out_pairs": len(test_pairs),
        "refresh": config.rank.refresh,
        "before": before,
        "after": after,
    }
    (folder / ("refresh.json" if config.rank.refresh else "metrics.json")).write_text(json.dumps(summary, indent=2))
    log.info("ranker on %d tasks, %d training pairs", len(labels), len(train_pairs))
    run.track("rank", {("refresh/" if config.rank.refresh else "") + key: value for key, value in after.items()})
    for name, values in (("before refresh", before), ("held out", after)):
        if values:
            run.say(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in values.items()))


def _evaluate(ranker, x, scores, rows, pairs) -> dict[str, float]:
    model_scores = ranker.logits(x)
    position = {row: i for i, row in enumerate(rows)}
    local_pairs = [(position[i], position[j]) for i, j in pairs]
    return ranking_metrics(model_scores[rows], scores[rows], local_pairs)
