"""evaluate: the base generator vs the trained one, judged by real solver runs -> ``RUN/eval/``.

Each arm samples ``evaluate.num_tasks`` tasks from the same contexts with the same seeds (the
trained arm is the generator with the adapter from ``train/``, and the co-evolved one with the adapter
from ``coevolve/train/`` when it exists); the solver attempts every valid task ``evaluate.k`` times.
The probe is never used. Per arm ``eval/ARM/tasks.jsonl`` and ``labels.jsonl`` are resumable like
generate and label; ``metrics.json``, ``table.md`` and ``solve_counts.png`` sum them up.
"""

from __future__ import annotations

import json
from pathlib import Path

from propel_core.errors import PropelError
from propel_core.evaluation import arm_metrics
from propel_core.execution import draw_contexts, label_tasks, sample_tasks
from propel_core.run import Run, log

#: evaluation draws its contexts and sampling seeds from the run's seed plus this, so the base arm
#: writes fresh tasks rather than repeating the labeled corpus (both arms share them)
EVALUATION_SEED_OFFSET = 1_000_003

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
    trained = run.dir / "train" / "adapter"
    if not trained.exists():
        raise PropelError(f"no trained adapter in {trained}: run `propel train` first")
    arms: dict[str, Path | None] = {"base": None, "trained": trained}
    coevolved = run.dir / "coevolve" / "train" / "adapter"
    if coevolved.exists():
        arms["coevolved"] = coevolved
    return arms


def evaluate(run: Run) -> None:
    """Sample, validate and solve tasks from each arm; write metrics, a table and histograms."""
    config = run.config
    folder = run.dir / "eval"
    evaluation = config.model_copy(
        update={
            "seed": config.seed + EVALUATION_SEED_OFFSET,
            "generate": config.generate.model_copy(update={"num_tasks": config.evaluate.num_tasks}),
            "label": config.label.model_copy(update={"k": config.evaluate.k}),
        }
    )
    run = Run(evaluation, run.registry, quiet=run.quiet, _domain=run.domain(), _executor=run._executor)
    contexts = draw_contexts(run)
    results = {}
    for arm, adapter in adapters(run).items():
        model = config.generator.model_copy(update={"adapter": str(adapter) if adapter else None})
        log.info("evaluating arm %s", arm)
        tasks = sample_tasks(run, model, contexts, folder / arm / "tasks.jsonl")
        valid = [task for task in tasks if task.validity.valid]
        labels = label_tasks(run, valid, folder / arm / "labels.jsonl")
        results[arm] = arm_metrics(tasks, labels, config.evaluate.k)
    (folder / "metrics.json").write_text(json.dumps(results, indent=2))
    table_text = table(results)
    (folder / "table.md").write_text(table_text + "\n")
    histogram_plot(folder / "solve_counts.png", results, config.evaluate.k, config.label)
    print(table_text)


def table(results: dict[str, dict]) -> str:
    """The arms side by side as a Markdown table, each figure with its standard error."""
    arms = list(results)
    lines = ["| metric | " + " | ".join(arms) + " |", "|---" * (len(arms) + 1) + "|"]
    lines.append("| generations (valid, in band) | " + " | ".join(
        f"{m['generations']} ({m['valid']}, {m['in_band']})" for m in results.values()) + " |")  # fmt: skip
    for key, heading in TABLE:
        lines.append(f"| {heading} | " + " | ".join(_with_se(results[arm][key]) for arm in arms) + " |")
    lines.append("| solve counts 0..K | " + " | ".join(
        " ".join(map(str, results[arm]["solve_counts"])) for arm in arms) + " |")  # fmt: skip
    return "\n".join(lines)


def _with_se(pair: list[float] | tuple[float, float] | None) -> str:
    return "n/a" if pair is None else f"{pair[0]:.3f} ± {pair[1]:.3f}"


def histogram_plot(path: Path, results: dict[str, dict], k: int, band) -> None:
    """Solve-count histograms of every arm (share of labeled tasks), the target band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(results)
    for position, (arm, metrics) in enumerate(results.items()):
        shares = [value for value, _ in metrics["solve_count_shares"]]
        errors = [se for _, se in metrics["solve_count_shares"]]
        xs = [count - 0.4 + width * (position + 0.5) for count in range(k + 1)]
        axis.bar(xs, shares, width, yerr=errors, capsize=2, label=f"{arm} (n={metrics['labeled']})")
    axis.axvspan(band.band_low * k - 0.5, band.band_high * k + 0.5, color="green", alpha=0.12, label="target band")
    axis.set_xticks(range(k + 1))
    axis.set_xlabel(f"solver successes out of {k}")
    axis.set_ylabel("share of valid tasks")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
