"""evaluate: the base generator vs the trained one, judged by real solver runs -> ``RUN/eval/``.

Each arm samples ``evaluate.num_tasks`` tasks from the same contexts with the same seeds (the
trained arm is the generator with the adapter from ``train/``, and the co-evolved one with the adapter
from ``coevolve/train/`` when it exists); the solver attempts every valid task ``evaluate.k`` times.
The probe is never used. Per arm ``eval/ARM/tasks.jsonl`` and ``labels.jsonl`` are resumable like
generate and label; ``metrics.json``, ``table.md`` and ``solve_counts.png`` sum them up, with each
trained arm's utility compared with base's context by context (``vs_base``: the mean difference and
its 95% paired bootstrap interval).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from propel_core.evaluation import (
    arm_metrics,
    evaluation_verdict,
    histogram_plot,
    paired_comparison,
    per_context_utility,
    shift_text,
)
from propel_core.execution import sample_and_label, ungradable_summary
from propel_core.provenance import folder_digest, holds_records
from propel_core.records import write_readable
from propel_core.run import Run

log = logging.getLogger("propel")

#: the rows of the side-by-side table: metric key and its heading
TABLE = (
    ("utility", "utility (in band / all)"),
    ("valid_rate", "valid rate"),
    ("self_bleu_3", "Self-BLEU-3 (lower = more diverse)"),
    ("distinct_3", "Distinct-3"),
    ("top_topic_share", "top-topic share"),
)


def adapters(run: Run) -> dict[str, Path | None]:
    """The arms to compare: the base generator and every trained adapter in the run folder."""
    best = run.plans.evaluate.adapter == "best_audited"
    trained = run.input("train/best_audited" if best else "train/adapter", "train")
    arms: dict[str, Path | None] = {"base": None, "trained": trained}
    coevolved = run.dir / "coevolve" / "train" / "adapter"
    if coevolved.exists():
        arms["coevolved"] = coevolved
    return arms


def evaluate(run: Run) -> None:
    """Sample, validate and solve tasks from each arm; write metrics, a table and histograms."""
    plan = run.plans.evaluate
    folder = plan.folder
    arms = adapters(run)
    for arm, adapter in arms.items():  # every arm before any work: a refusal loses nothing
        digest = {"adapter": folder_digest(adapter) if adapter else None}  # a retrained adapter is another arm
        run.claim(f"eval/{arm}", holds_records(*(folder / arm).glob("*.jsonl")), values=digest)
    k = plan.labels.label.k
    contexts = plan.contexts.sampler(run.services).sample(plan.num_tasks)
    results, utilities, every_label = {}, {}, []
    for arm, adapter in arms.items():
        log.info("evaluating arm %s", arm)
        redo = run.redo_ungradable
        tasks, labels = sample_and_label(run.services, plan, adapter, contexts, folder / arm, redo)
        every_label += labels
        results[arm] = arm_metrics(tasks, labels, k)
        utilities[arm] = per_context_utility(tasks, labels)
        if arm != "base":  # the same contexts and seeds as base: a paired comparison, context by context
            results[arm]["vs_base"] = paired_comparison(utilities[arm], utilities["base"], seed=plan.seed)
    (folder / "metrics.json").write_text(json.dumps(results, indent=2))
    for arm, values in results.items():
        run.track("evaluate", {f"{arm}/{key}": number for key, number in headline(values).items()})
    table_text = table(results)
    write_readable(folder / "table.md", table_text + "\n")
    histogram_plot(folder / "solve_counts.png", results, k, plan.labels.label)
    run.say(table_text)
    run.say(evaluation_verdict(results))
    ungradable_summary(run.services, "evaluate", every_label)


def headline(values: dict) -> dict[str, float]:
    """An arm's numbers for a tracker: each rate's value (not its standard error), the counts, the
    solve-count histogram (``solved_J_of_K``) and the paired shift against base."""
    counts = values["solve_counts"]
    out = {f"solved_{j}_of_{len(counts) - 1}": count for j, count in enumerate(counts)}
    for key, value in values.items():
        if key.startswith("solve_count"):
            continue
        value = value[0] if isinstance(value, list | tuple) else value
        if isinstance(value, int | float):
            out[key] = value
    if "vs_base" in values:
        out["utility_minus_base"] = values["vs_base"]["mean_difference"]
    return out


def table(results: dict[str, dict]) -> str:
    """The arms side by side as a Markdown table, each figure with its standard error."""
    arms = list(results)
    lines = ["| metric | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    lines.append(
        "| generations (valid, in band) | "
        + " | ".join(f"{m['generations']} ({m['valid']}, {m['in_band']})" for m in results.values())
        + " |"
    )
    for key, heading in TABLE:
        lines.append(f"| {heading} | " + " | ".join(_with_se(results[arm][key]) for arm in arms) + " |")
    shifts = " | ".join(shift_text(results[arm].get("vs_base")) for arm in arms)
    lines.append(f"| utility - base (paired 95% CI) | {shifts} |")
    lines.append(
        "| solve counts 0..K | " + " | ".join(" ".join(map(str, results[arm]["solve_counts"])) for arm in arms) + " |"
    )
    return "\n".join(lines)


def _with_se(pair: list[float] | tuple[float, float] | None) -> str:
    return "n/a" if pair is None else f"{pair[0]:.3f} ± {pair[1]:.3f}"
