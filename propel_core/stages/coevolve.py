"""coevolve: retrain the generator against a probe that has seen its exploits -> ``RUN/coevolve/``.

Paper section 6 and appendix 12. ``coevolve.mode: adversarial`` mines the trained policy's false
positives from ``eval/trained/`` (valid tasks the probe scores as in band whose real solve count is
outside it), plus the dominant topic's valid tasks when configured, as negatives; trains an auxiliary
probe (same cell as the selected one) against the original in-band tasks; and retrains the generator
with the ``adversarial`` rule, min(main logit, auxiliary logit) on valid tasks. ``coevolve.mode:
wco`` trains more probes at the selected cell with other seeds and retrains with the ``wco`` rule, the
minimum over the ensemble. Either way the new adapter lands in ``coevolve/train/adapter``, which
``propel evaluate`` then compares as a third arm.
"""

from __future__ import annotations

import math
from collections import Counter

from propel_core.errors import NotEnoughData
from propel_core.probes import fit_temperature, load_probe, metrics, save_bundle, train_probe
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run, log
from propel_core.stages.extract import load_activations
from propel_core.stages.probe import splits
from propel_core.stages.train import train_generator


def coevolve(run: Run) -> None:
    """Auxiliary probe from mined false positives (or a probe ensemble), then GRPO again -> coevolve/."""
    config = run.config
    selected = run.input("probes/selected", made_by="probe")
    folder = run.dir / "coevolve"
    if config.coevolve.mode == "adversarial":
        extra = [auxiliary_probe(run, folder / "auxiliary")]
    else:
        extra = ensemble(run, folder / "ensemble")
    reward = config.reward.model_copy(update={"rule": config.coevolve.mode, "probes": [str(p) for p in extra]})
    retrain = Run(config.model_copy(update={"reward": reward}), run.registry, quiet=run.quiet, _domain=run.domain())
    log.info("retraining with the %s rule: %s + %s", config.coevolve.mode, selected, ", ".join(map(str, extra)))
    train_generator(retrain, folder / "train")


def original_rows(run: Run, layer: int, pooling: str):
    """Features and labels of the labeled corpus at one cell (rows with a known utility)."""
    import torch

    ids, x = load_activations(run.dir, layer, pooling)
    row_of = {task_id: row for row, task_id in enumerate(ids)}
    labels = [
        label
        for label in iter_jsonl(run.dir / "labels.jsonl", Label)
        if label.utility is not None and label.task_id in row_of
    ]
    rows = torch.tensor([row_of[label.task_id] for label in labels], dtype=torch.long)
    return x[rows], torch.tensor([float(label.utility) for label in labels])


def false_positives(run: Run, main) -> list[Task]:
    """Valid tasks of the trained policy the probe scores in band whose real solve count is not,
    plus, when configured, the valid tasks of the policy's most common topic."""
    config = run.config.coevolve
    labels = {label.task_id: label for label in iter_jsonl(run.input("eval/trained/labels.jsonl", "evaluate"), Label)}
    tasks = [task for task in iter_jsonl(run.dir / "eval" / "trained" / "tasks.jsonl", Task) if task.id in labels]
    scores = main.score([task.text for task in tasks]) if tasks else []
    mined = [
        task
        for task, score in zip(tasks, scores, strict=True)
        if score["probability"] >= config.false_positive_probability and labels[task.id].utility == 0
    ]
    log.info("%d of %d solver-labeled trained-policy tasks are probe false positives", len(mined), len(tasks))
    topics = Counter(task.topic for task in tasks if task.topic is not None)
    if config.dominant_topic and topics:
        dominant = topics.most_common(1)[0][0]
        seen = {task.id for task in mined}
        family = [task for task in tasks if task.topic == dominant and task.id not in seen]
        log.info("dominant topic %r adds %d negatives", dominant, len(family))
        mined += family
    return mined


def auxiliary_probe(run: Run, folder):
    """Train the auxiliary probe: original in-band tasks (1) vs mined negatives (0)."""
    import torch

    main = load_probe(run.dir / "probes" / "selected", run.registry)
    bundle = main.bundle
    negatives = false_positives(run, main)
    x_original, y_original = original_rows(run, bundle.layer, bundle.pooling)
    positives = x_original[y_original == 1]
    if not negatives or len(positives) == 0:
        raise NotEnoughData(
            f"the auxiliary probe needs both classes: {len(positives)} original in-band tasks and "
            f"{len(negatives)} mined negatives; evaluate more trained-policy tasks (evaluate.num_tasks)"
        )
    x = torch.cat([positives, main.features([task.text for task in negatives])])
    y = torch.cat([torch.ones(len(positives)), torch.zeros(len(negatives))])
    return _fit_and_save(run, folder, bundle, x, y, seed=run.config.seed, source="auxiliary (co-evolution)")


def ensemble(run: Run, folder) -> list:
    """Probes at the selected cell trained with other seeds on the original corpus (wco)."""
    bundle = load_probe(run.dir / "probes" / "selected", run.registry).bundle
    x, y = original_rows(run, bundle.layer, bundle.pooling)
    return [
        _fit_and_save(run, folder / f"seed-{seed}", bundle, x, y, seed=seed, source=f"ensemble member, seed {seed}")
        for seed in range(run.config.seed + 1, run.config.seed + run.config.coevolve.ensemble_size)
    ]


def _fit_and_save(run: Run, folder, bundle, x, y, seed: int, source: str):
    """Train one probe of the selected cell's architecture on (x, y), report its test metrics, save it."""
    import torch

    probe_config = run.config.probe
    train, val, test = next(splits(y, [str(i) for i in range(len(y))], "weighted", "random", probe_config, seed))
    factory = run.component("probe_architectures", bundle.architecture)
    trained = train_probe(factory, x, y, train, val, probe_config, True, seed)
    temperature = fit_temperature(trained.logits(x[val]), y[val]) if probe_config.calibrate else 1.0
    scores = metrics(y[test], trained.logits(x[test]), torch.zeros(len(test)))
    log.info("%s: %d rows, test balanced accuracy %.3f", source, len(y), scores["balanced_accuracy"])
    finite = {k: v for k, v in scores.items() if math.isfinite(v)}
    description = bundle.model_copy(update={"temperature": temperature, "training_rows": len(train), "metrics": finite})
    save_bundle(folder, trained, description)
    return folder
