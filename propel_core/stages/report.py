"""report: one self-contained HTML page about the run -> ``RUN/report.html``.

Config, data funnel, probe sweep and the selected probe with its reliability diagram, training curves,
base vs trained, and example tasks from each solve-count bucket. Pictures are embedded as data URIs,
so the page can be mailed or attached as it is. A section whose stage has not run says which stage
to run.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from pathlib import Path

from propel_core.config import dump_config
from propel_core.records import Label, Task, iter_jsonl
from propel_core.run import Run

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ddd; padding: .25em .6em; }
th { background: #f4f4f4; text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
img { max-width: 100%; } .missing { color: #a33; } .task { white-space: pre-wrap; font-family: monospace; }
"""


def report(run: Run) -> None:
    """Write one self-contained HTML page on the run -> report.html."""
    root = run.dir
    sections = [
        ("Configuration", f"<pre>{html.escape(dump_config(run.config))}</pre>"),
        ("Data funnel", funnel_section(root)),
        ("Probe", probe_section(root)),
        ("Training", training_section(root)),
        ("Base vs trained (real solver runs)", evaluation_section(root)),
        ("Example tasks by solve count", examples_section(root, run.config.label.k)),
    ]
    body = "".join(f"<h2>{title}</h2>{content}" for title, content in sections)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>propel report: {html.escape(str(root))}</title>"
        f"<style>{STYLE}</style></head><body><h1>propel report: {html.escape(str(root))}</h1>{body}</body></html>"
    )
    (root / "report.html").write_text(page)
    print(f"report: {root / 'report.html'}")


def missing(stage: str) -> str:
    return f"<p class='missing'>not available yet: run <code>propel {stage}</code>.</p>"


def image(path: Path, alt: str) -> str:
    if not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<p><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></p>"


def rows_table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = "".join(
        "<tr>" + "".join(_cell(cell) for cell in row) + "</tr>"
        for row in rows
    )  # fmt: skip
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(cell: object) -> str:
    if isinstance(cell, float):
        return f"<td class='n'>{cell:.3f}</td>"
    if isinstance(cell, int):
        return f"<td class='n'>{cell}</td>"
    return f"<td>{html.escape(str(cell))}</td>"


def funnel_section(root: Path) -> str:
    if not (root / "tasks.jsonl").exists():
        return missing("generate")
    tasks = list(iter_jsonl(root / "tasks.jsonl", Task))
    labels = list(iter_jsonl(root / "labels.jsonl", Label))
    steps = [
        ("generated", len(tasks)),
        ("parsed", sum(task.payload is not None for task in tasks)),
        ("valid", sum(task.validity.valid for task in tasks)),
        ("labeled", len(labels)),
        ("in band", sum(label.utility == 1 for label in labels)),
    ]
    return rows_table(["step", "tasks"], [list(step) for step in steps])


def probe_section(root: Path) -> str:
    bundle = root / "probes" / "selected" / "probe.json"
    if not bundle.exists():
        return missing("probe")
    description = json.loads(bundle.read_text())
    chosen = [
        ["cell", f"layer {description['layer']}, {description['pooling']}, {description['architecture']}"],
        ["temperature", description["temperature"]],
        ["training rows", description["training_rows"]],
    ] + [[name, value] for name, value in sorted(description["metrics"].items())]
    return (
        image(root / "probes" / "sweep_heatmap.png", "probe sweep heatmap")
        + "<h3>Selected probe</h3>"
        + rows_table(["", ""], chosen)
        + image(root / "probes" / "reliability.png", "reliability diagram")
    )


def training_section(root: Path) -> str:
    log_path = root / "train" / "reward_log.jsonl"
    if not log_path.exists():
        return missing("train")
    entries = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    curves = root / "train" / "curves.png"
    training_curves(curves, entries)
    return image(curves, "training curves")


def training_curves(path: Path, entries: list[dict]) -> None:
    """Reward mean (with its spread), validity rate and degenerate-group rate per scorer call."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = range(1, len(entries) + 1)
    figure, (reward_axis, rate_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    means = [e["reward_mean"] for e in entries]
    spreads = [e["reward_std"] for e in entries]
    reward_axis.plot(calls, means, marker="o")
    low = [m - s for m, s in zip(means, spreads, strict=True)]
    high = [m + s for m, s in zip(means, spreads, strict=True)]
    reward_axis.fill_between(calls, low, high, alpha=0.2)
    reward_axis.set_title("reward (mean ± std)")
    reward_axis.set_xlabel("reward call")
    rate_axis.plot(calls, [e["validity_rate"] for e in entries], marker="o", label="validity rate")
    rate_axis.plot(calls, [e["degenerate_groups"] for e in entries], marker="s", label="degenerate groups")
    rate_axis.set_ylim(-0.05, 1.05)
    rate_axis.set_xlabel("reward call")
    rate_axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def evaluation_section(root: Path) -> str:
    table_path = root / "eval" / "table.md"
    if not table_path.exists():
        return missing("evaluate")
    lines = [line for line in table_path.read_text().splitlines() if line.strip()]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return rows_table(header, rows) + image(root / "eval" / "solve_counts.png", "solve-count histograms")


def examples_section(root: Path, k: int, per_bucket: int = 2) -> str:
    if not (root / "labels.jsonl").exists():
        return missing("label")
    tasks = {task.id: task for task in iter_jsonl(root / "tasks.jsonl", Task)}
    buckets: dict[int, list[Task]] = defaultdict(list)
    for label in iter_jsonl(root / "labels.jsonl", Label):
        solved = sum(bool(a.solved) for a in label.attempts)
        if len(buckets[solved]) < per_bucket and label.task_id in tasks:
            buckets[solved].append(tasks[label.task_id])
    parts = []
    for solved in sorted(buckets):
        parts.append(f"<h3>solved {solved}/{k}</h3>")
        for task in buckets[solved]:
            text = task.text if isinstance(task.text, str) else "\n---\n".join(task.text or [])
            parts.append(f"<p class='task'>{html.escape(text)}</p>")
    return "".join(parts) or "<p>no labeled tasks.</p>"
