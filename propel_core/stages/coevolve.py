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

import logging
from collections import Counter
from pathlib import Path

from propel_core.config import CoevolveConfig, ProbeConfig
from propel_core.errors import NotEnoughData, PropelError
from propel_core.probes.activations import labeled_rows
from propel_core.probes.bundles import load_probe
from propel_core.probes.cells import ensemble_probes, fit_at_cell
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run
from propel_core.training.checkpoints import prepare_folder
from propel_core.training.generator import train_generator
from propel_core.training.generator_reward import main_probe, reward_reads, settled_reward

log = logging.getLogger("propel")


def coevolve(run: Run) -> None:
    """Auxiliary probe from mined false positives (or a probe ensemble), then GRPO again -> coevolve/."""
    config, plan = run.config, run.plans.coevolve
    selected = run.input("probes/selected", made_by="probe")
    folder = run.dir / "coevolve"
    # refused now, not after the extra probes trained: a main bundle whose lowest valid logit is unknown
    settled_reward(run.services, plan.reward, [main_probe(run.services, plan.reward)], quiet=True)
    if config.coevolve.mode == "adversarial":
        extra = [auxiliary_probe(run, folder / "auxiliary", config.coevolve, config.probe, config.seed)]
    else:
        size = config.coevolve.ensemble_size
        extra = ensemble_probes(run.registry, run.dir, config.probe, config.seed, size, folder / "ensemble")
    plan = plan.with_probes(extra)
    reward = plan.reward
    log.info("retraining with the %s rule: %s + %s", reward.rule, selected, ", ".join(map(str, extra)))
    prepare_folder(plan.folder, False, run.say)  # retrained whole: the old training is moved aside first
    keys, values = reward_reads(run.services, reward)
    values |= {"reward.rule": reward.rule, "reward.probes": reward.probes}
    run.claim("coevolve", False, (*keys, "coevolve"), values)  # recorded: the reward it trains with
    train_generator(run.services, plan)


def policy_rows(run: Run) -> tuple[list[Task], dict[str, Label]]:
    """The trained policy's solver-labeled tasks: the evaluation's (``eval/trained``) and the audits'
    of its training (``train/audit``, ``train.audit``), whichever exist."""
    folders = [run.dir / "eval" / "trained", run.dir / "train" / "audit"]
    found = [folder for folder in folders if (folder / "labels.jsonl").exists()]
    if not found:
        raise PropelError(
            f"no solver labels of the trained policy's tasks in {folders[0]} or {folders[1]}: run "
            "`propel evaluate`, or train with train.audit.every"
        )
    labels = {label.task_id: label for folder in found for label in iter_jsonl(folder / "labels.jsonl", Label)}
    tasks = [task for folder in found for task in iter_jsonl(folder / "tasks.jsonl", Task) if task.id in labels]
    return tasks, labels


def false_positives(run: Run, main, config: CoevolveConfig) -> list[Task]:
    """Valid tasks of the trained policy the probe scores in band whose real solve count is not,
    plus, when configured, the valid tasks of the policy's most common topic."""
    tasks, labels = policy_rows(run)
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


def auxiliary_probe(run: Run, folder: Path, config: CoevolveConfig, probe: ProbeConfig, seed: int) -> Path:
    """Train the auxiliary probe: original in-band tasks (1) vs mined negatives (0)."""
    import torch

    main = load_probe(run.dir / "probes" / "selected", run.registry)
    bundle = main.bundle
    negatives = false_positives(run, main, config)
    x_original, y_original = labeled_rows(run.dir, bundle.layer, bundle.pooling)
    positives = x_original[y_original == 1]
    if not negatives or len(positives) == 0:
        raise NotEnoughData(
            f"the auxiliary probe needs both classes: {len(positives)} original in-band tasks and "
            f"{len(negatives)} mined negatives; evaluate more trained-policy tasks (evaluate.num_tasks)"
        )
    x = torch.cat([positives, main.features([task.text for task in negatives])])
    y = torch.cat([torch.ones(len(positives)), torch.zeros(len(negatives))])
    return fit_at_cell(run.registry, folder, bundle, x, y, probe, seed, "auxiliary (co-evolution)")
