"""probe: sweep layer x pooling x architecture x balance, select one probe, save it -> ``RUN/probes/``.

Writes ``sweep.csv`` (one row per cell, metrics averaged over seeds and folds), ``sweep_heatmap.png``
(validation balanced accuracy per layer x pooling, one panel per architecture and balance), and the
selected probe as a bundle in ``probes/selected/`` (``probe.safetensors`` + ``probe.json``) with its
reliability diagram (``reliability.png``). The sweep and the selection (appendix 14) are
:mod:`propel_core.probes.sweep`'s.
"""

from __future__ import annotations

from propel_core.probes.sweep import heatmap, known_labels, save_selected, select, selection_table, sweep, write_sweep
from propel_core.records import Task, iter_jsonl
from propel_core.run import Run
from propel_core.training.generator_reward import rule_of_cell


def probe(run: Run) -> None:
    """Sweep probe cells on the labeled activations, select one, and save it -> probes/."""
    config = run.config
    # rewritten whole each time: recorded, for what trains against it (RVP reads the rule and its options)
    run.claim("probes", False, (f"reward.options.{config.reward.rule}",))
    labels = known_labels(run.dir / "labels.jsonl")
    tasks = {task.id: task for task in iter_jsonl(run.dir / "tasks.jsonl", Task)}
    plan = run.plans.sweep
    found = sweep(run.services, plan, labels, tasks, rule_of_cell(run.services, plan.reward))
    folder = run.dir / "probes"
    folder.mkdir(parents=True, exist_ok=True)
    write_sweep(folder / "sweep.csv", found.cells)
    heatmap(folder / "sweep_heatmap.png", found.cells, config.probe)
    chosen = select(found.cells, config.probe)
    run.track("probe", {f"selected/{key}": value for key, value in chosen.items()})
    run.tracker.table("probe", "sweep", found.cells)
    save_selected(folder, found, chosen, plan)
    run.say(selection_table(found.cells, chosen))
