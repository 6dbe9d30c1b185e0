"""report: one self-contained HTML page about the run -> ``RUN/report.html``.

The page leads with the answer: utility per arm with its interval and a one-sentence verdict (from
the frontier-shift experiment, ``benchmarks/frontier_shift.py``, when the run folder holds one; else
from ``propel evaluate``). Then the evidence: the probe's quality on held-out rows (and, in an
experiment, on each arm's own tasks), training curves, solve-count histograms, the data funnel and
example tasks; the config comes last, folded. Every metric carries the rows it was measured on, and
one measured on fewer than 30 says so. Pictures are embedded as data URIs, so the page can be mailed
or attached as it is. A section whose stage has not run says which stage to run, and why it did not
run where a stage refused (``RUN/refusals.json``, kept by :func:`propel_core.provenance.record_refusal`).
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from pathlib import Path

from propel_core.config import dump_config
from propel_core.evaluation import evaluation_verdict, shift_text
from propel_core.execution import ungradable_line
from propel_core.provenance import refusals
from propel_core.records import Label, Task, iter_jsonl, write_readable
from propel_core.run import Run
from propel_core.training.audit import read_records
from propel_core.training.generator_reward import COMPLETIONS, main_probe

#: where ``benchmarks/frontier_shift.py`` leaves the experiment's summary (``benchmarks/experiment.py``)
EXPERIMENT = Path("experiment") / "frontier_shift.json"
#: a metric measured on fewer rows than this is flagged as anecdotal
FEW_ROWS = 30

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; } td, th { border: 1px solid #ddd; padding: .25em .6em; }
th { background: #f4f4f4; text-align: left; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
img { max-width: 100%; } .missing { color: #a33; } .task { white-space: pre-wrap; font-family: monospace; }
.verdict { font-size: 1.15em; background: #eef4fa; border-left: 4px solid #2c5d8a; padding: .6em .9em; }
.few { color: #a33; } summary { cursor: pointer; color: #2c5d8a; }
"""


def report(run: Run) -> None:
    """Write one self-contained HTML page on the run -> report.html."""
    root = run.dir
    experiment = root / EXPERIMENT
    if experiment.exists():
        summary = json.loads(experiment.read_text())
        folder = experiment.parent
        sections = [
            ("Does it work? The frontier-shift experiment", experiment_section(summary, folder)),
            (
                "Probe quality",
                probe_section(root, main_probe(run.services, run.config.reward)) + probe_on_arms_section(summary),
            ),
            (
                "Training, per arm (mean over RL seeds)",
                image(folder / "curves.png", "training curves per arm") + training_table(summary),
            ),
            ("Solve counts per arm (pooled over RL seeds)", image(folder / "solve_counts.png", "solve counts")),
        ]
    else:
        sections = [
            ("Does it work? Base vs trained (real solver runs)", headline_section(root)),
            ("Probe quality", probe_section(root, main_probe(run.services, run.config.reward))),
            ("Training", training_section(root)),
            ("Solve counts, base vs trained", evaluation_section(root)),
        ]
    sections += [
        ("Data funnel", funnel_section(root)),
        ("Example tasks by solve count", examples_section(root, run.config.label.k)),
        (
            "Configuration",
            "<details><summary>the run's resolved config (click to open)</summary>"
            f"<pre>{html.escape(dump_config(run.config, run.registry))}</pre></details>",
        ),
    ]
    body = "".join(f"<h2>{title}</h2>{content}" for title, content in sections)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>propel report: {html.escape(str(root))}</title>"
        f"<style>{STYLE}</style></head><body><h1>propel report: {html.escape(str(root))}</h1>{body}</body></html>"
    )
    write_readable(root / "report.html", page)
    run.say(f"report: {root / 'report.html'}")


def with_n(value: float | None, n: int | float | None, digits: int = 3) -> Markup:
    """A metric with the rows it was measured on; fewer than FEW_ROWS are flagged."""
    if value is None:
        return Markup("n/a")
    if n is None:
        return Markup(f"{value:.{digits}g}")
    flag = f" <span class='few'>(only {int(n)} rows: too few to tell)</span>" if n < FEW_ROWS else ""
    return Markup(f"{value:.{digits}f} (n={int(n)}){flag}")


def headline_section(root: Path) -> str:
    """Utility per arm with its standard error, each trained arm against base, and the verdict."""
    path = root / "eval" / "metrics.json"
    if not path.exists():
        return missing(root, "evaluate")
    results = json.loads(path.read_text())
    rows = [
        [
            arm,
            f"{m['utility'][0]:.3f} ± {m['utility'][1]:.3f}",
            m["generations"],
            m["valid"],
            m["in_band"],
            shift_text(m.get("vs_base")),
        ]
        for arm, m in results.items()
    ]
    if not any("vs_base" in m for m in results.values()):
        return rows_table(["arm", "utility ± SE", "generations", "valid", "in band", "utility - base"], rows)
    contexts = results["base"]["generations"]
    sentence = evaluation_verdict(results)
    few = " <span class='few'>(few contexts: a wide interval)</span>" if contexts < FEW_ROWS else ""
    return f"<p class='verdict'>{html.escape(sentence)}{few}</p>" + rows_table(
        ["arm", "utility ± SE", "generations", "valid", "in band", "utility - base (95% CI)"], rows
    )


def experiment_section(summary: dict, folder: Path) -> str:
    """The headline of the frontier-shift experiment: verdict, table per arm and the Figure 2 bars."""
    arms, setting = summary["arms"], summary["setting"]
    seeds = len(setting["seeds"])
    sentence = summary["verdict"]
    rows = []
    for arm, values in arms.items():
        utility, valid = values["utility"], values["valid_rate"]
        shift = values.get("vs_base")
        # one seed gives no t-interval over seeds (paired_comparison's seed_t95 needs two groups)
        seed_t = "-" if shift is None or not shift.get("seed_t95") else "[{:+.3f}, {:+.3f}]".format(*shift["seed_t95"])
        rows.append(
            [
                arm,
                f"{utility['mean']:.3f} ± {utility['se']:.3f}",
                shift_text(shift),
                seed_t,
                f"{valid['mean']:.3f} ± {valid['se']:.3f}",
                sum(values["generations_per_seed"]),
                round(values["solver_trials"]["total"]),
                round(values["wall_seconds"]["total"]),
            ]
        )
    header = [
        "arm",
        f"utility ± SE ({seeds} seeds)",
        "utility - base [95% bootstrap, seeds x contexts]",
        f"[95% t-interval, {seeds} seeds]",
        "valid rate",
        "generations",
        "solver trials",
        "wall s",
    ]
    diversity = [
        [
            arm,
            _mean_se(values["self_bleu_3"]),
            _mean_se(values["distinct_3"]),
            _mean_se(values["top_topic_share"]),
            values["top_topic"] or "-",
        ]
        for arm, values in arms.items()
    ]
    described = "; ".join(
        f"{key}: " + (", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
        for key, value in setting.items()
    )
    return (
        f"<p class='verdict'>{html.escape(sentence)}</p>"
        + rows_table(header, rows)
        + image(folder / "utility.png", "utility per arm and solver trials per arm")
        + "<p>Solver trials: offline ones label the probe's corpus once (shared by hard and wco); online ones "
        "are spent inside RL, per seed. Wall seconds: one training run, plus for the probe arms the corpus "
        "(generate, label, extract, probe; wco also its second probe). Wall time follows the solver's cost: "
        f"this one ({html.escape(str(setting.get('solver')))}) answers in microseconds when it is simulated, "
        "so solver trials are the cost that carries over to real solvers. The standard errors and intervals "
        "vary the RL seed; the corpus and the probes are the same for every seed.</p>"
        + rows_table(
            ["arm", "Self-BLEU-3 (lower = more diverse)", "Distinct-3", "top-topic share", "top topic"], diversity
        )
        + f"<p><small>{html.escape(described)}</small></p>"
    )


def _mean_se(value: dict | None) -> str:
    return "n/a" if value is None else f"{value['mean']:.3f} ± {value['se']:.3f}"


def probe_on_arms_section(summary: dict) -> str:
    """The selected probe on each arm's own solver-labeled tasks: does it still tell them apart, and
    does its mean probability follow the real in-band rate (a probe the policy exploited does not)?"""
    rows = []
    for arm, values in summary["arms"].items():
        found = values.get("probe_on_tasks")
        if not found:
            continue
        n = found["rows"]
        rows.append(
            [
                arm,
                n,
                with_n(found.get("mean_probability"), n),
                with_n(found.get("in_band_rate"), n),
                with_n(found.get("auc"), n),
                with_n(found.get("balanced_accuracy"), n),
            ]
        )
    if not rows:
        return ""
    return "<h3>The selected probe on each arm's own tasks</h3>" + rows_table(
        ["arm", "labeled tasks", "mean probe probability", "real in-band rate", "AUC", "balanced accuracy"], rows
    )


def training_table(summary: dict) -> str:
    """First and last step of each trained arm's curve: reward, validity, degenerate groups, KL."""
    rows = []
    for arm, values in summary["arms"].items():
        curve = values.get("training") or []
        for row in curve[:1] + curve[-1:]:
            rows.append(
                [arm, row["step"] + 1]
                + [
                    _number(row[key])
                    for key in ("reward_mean", "reward_std", "validity_rate", "degenerate_groups", "kl")
                ]
            )
    header = ["arm", "step", "reward mean", "reward std", "validity", "degenerate groups", "KL"]
    return rows_table(header, rows) if rows else ""


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def missing(root: Path, stage: str) -> str:
    """What a section whose output ``stage`` writes says instead: why the stage refused when it did,
    else why the pipeline stopped before it (an earlier stage that refused), else the command to run."""
    found = refusals(root)
    if stage in found:
        reason = f"<code>propel {stage}</code> refused: {html.escape(found[stage]['reason'])}"
        return f"<p class='missing'>not available: {reason}</p>"
    earlier = [name for name, refusal in found.items() if stage in refusal["blocks"]]
    if earlier:
        before = earlier[-1]
        reason = f"<code>propel {before}</code>, which refused: {html.escape(found[before]['reason'])}"
        return f"<p class='missing'>not available yet: <code>propel {stage}</code> comes after {reason}</p>"
    return f"<p class='missing'>not available yet: run <code>propel {stage}</code>.</p>"


def image(path: Path, alt: str) -> str:
    if not path.exists():
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f"<p><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></p>"


class Markup(str):
    """HTML this module wrote itself (a metric with its few-rows flag): table cells keep it as it is,
    while every other text, the model-written tasks above all, is escaped."""


def rows_table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(str(cell))}</th>" for cell in header)
    body = "".join("<tr>" + "".join(_cell(cell) for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(cell: object) -> str:
    if isinstance(cell, float):
        return f"<td class='n'>{cell:.3f}</td>"
    if isinstance(cell, int):
        return f"<td class='n'>{cell}</td>"
    return f"<td>{cell if isinstance(cell, Markup) else html.escape(str(cell))}</td>"


def funnel_section(root: Path) -> str:
    if not (root / "tasks.jsonl").exists():
        return missing(root, "generate")
    tasks = list(iter_jsonl(root / "tasks.jsonl", Task))
    labels = list(iter_jsonl(root / "labels.jsonl", Label))
    steps = [
        ("generated", len(tasks)),
        ("parsed", sum(task.payload is not None for task in tasks)),
        ("valid", sum(task.validity.valid for task in tasks)),
        ("labeled", len(labels)),
        ("with a known utility (enough gradable attempts)", sum(label.utility is not None for label in labels)),
        ("in band", sum(label.utility == 1 for label in labels)),
    ]
    line = ungradable_line("label", labels)
    note = f"<p class='missing'>{html.escape(line)}</p>" if line else ""
    return rows_table(["step", "tasks"], [list(step) for step in steps]) + note


def probe_section(root: Path, selected: Path) -> str:
    """The probe the reward reads (``selected``: ``reward.main_probe``, else the run's own), with the
    sweep it was chosen from when that sweep's folder has one."""
    bundle = selected / "probe.json"
    if not bundle.exists():
        return missing(root, "probe")
    description = json.loads(bundle.read_text())
    found = description["metrics"]
    chosen = [
        ["bundle", str(selected) if selected != root / "probes" / "selected" else "this run's probes/selected"],
        ["cell", f"layer {description['layer']}, {description['pooling']}, {description['architecture']}"],
        ["temperature", description["temperature"]],
        ["training rows", description["training_rows"]],
    ]
    for split, name in (("test", "held-out test rows"), ("val", "validation rows (used for early stopping)")):
        for metric in ("balanced_accuracy", "auc", "spearman", "ece", "f1"):
            if f"{split}_{metric}" in found:
                chosen.append([f"{metric} on {name}", with_n(found[f"{split}_{metric}"], found.get(f"{split}_rows"))])
    if "rvp" in found:
        chosen.append(
            [
                "RVP (variance of the RL reward over base-policy tasks)",
                with_n(found["rvp"], found.get("rvp_rows"), digits=4),
            ]
        )
    sweep = selected.parent
    return (
        "<h3>Selected probe</h3><p>Each metric is the mean over the sweep's splits, with the mean rows per "
        "split; the reliability diagram shows the rows held out from the split the selected head was fitted "
        "on.</p>"
        + rows_table(["", ""], chosen)
        + image(sweep / "reliability.png", "reliability diagram")
        + image(sweep / "sweep_heatmap.png", "probe sweep heatmap")
        + sweep_table(sweep / "sweep.csv", description)
    )


SWEEP_COLUMNS = (
    ("layer", "layer"),
    ("pooling", "pooling"),
    ("architecture", "architecture"),
    ("balance", "balance"),
    ("val_balanced_accuracy", "val bacc"),
    ("val_ece", "val ece"),
    ("test_balanced_accuracy", "test bacc"),
    ("rvp", "RVP"),
)


def _sweep_value(value: str) -> str:
    try:
        return f"{float(value):.3f}"
    except ValueError:
        return value


def sweep_table(path: Path, selected: dict) -> str:
    """Every cell of the sweep (``sweep.csv``), best validation balanced accuracy first, the selected
    one marked; nothing where there is no sweep file."""
    import csv

    if not path.exists():
        return ""
    with path.open(newline="") as handle:
        cells = list(csv.DictReader(handle))
    cells.sort(key=lambda cell: -float(cell.get("val_balanced_accuracy") or "nan"))
    rows = []
    for cell in cells:
        mine = all(str(selected.get(key)) == cell.get(key) for key in ("layer", "pooling", "architecture"))
        shown = [cell.get(key, "") for key, _ in SWEEP_COLUMNS]
        rows.append([_sweep_value(value) if i > 3 else value for i, value in enumerate(shown)] + ["selected" * mine])
    return (
        "<details><summary>every cell of the sweep</summary>"
        + rows_table([name for _, name in SWEEP_COLUMNS] + [""], rows)
        + "</details>"
    )


def training_section(root: Path) -> str:
    log_path = root / "train" / "reward_log.jsonl"
    if not log_path.exists():
        return missing(root, "train")
    entries = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    curves = root / "train" / "curves.png"
    training_curves(curves, entries)
    section = rules_line(entries) + alarms(entries) + image(curves, "training curves")
    section += sampler_section(entries) + audit_section(root / "train", entries)
    return section + completions_table(root / "train" / COMPLETIONS)


def sampler_section(entries: list[dict]) -> str:
    """What the context sampler said of itself at the last step that logged it (``diagnostics()``, e.g.
    the progress sampler's bucket probabilities beside the data's); nothing for a sampler that says
    nothing."""
    logged = [entry for entry in entries if isinstance(entry.get("sampler"), dict)]
    if not logged:
        return ""
    rows = [[key, _diagnostic(value)] for key, value in logged[-1]["sampler"].items()]
    return f"<h3>Context sampler, at step {logged[-1]['step'] + 1}</h3>" + rows_table(["", ""], rows)


def _diagnostic(value: object) -> str:
    """A sampler's diagnostic as a line: numbers to 3 digits, a mapping of them as name-value pairs."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int | float):
        return f"{value:.3g}"
    if isinstance(value, dict) and all(isinstance(v, int | float) for v in value.values()):
        return ", ".join(f"{key} {number:.3g}" for key, number in value.items())
    return json.dumps(value)[:300]


def audit_section(folder: Path, entries: list[dict]) -> str:
    """The audits (``train.audit``): the probe's mean probability per step beside the real in-band rate
    and utility the solver found on the audited tasks, with their intervals, and a row per audit."""
    audits = read_records(folder)
    if not audits:
        return ""
    figure = folder / "audit.png"
    audit_curves(figure, entries, audits)
    # not the seconds each took (audit.jsonl keeps them): the page of one seed is the same page every run
    keys = ["step", "utility", "in_band_rate", "probe_probability", "gap", "auroc", "valid_rate", "trials"]
    rows = [
        [audit.get(key) for key in keys] if "error" not in audit else [audit["step"], f"failed: {audit['error']}"]
        for audit in audits
    ]
    trials = sum(audit.get("trials", 0) for audit in audits)
    return (
        f"<h3>Audits: the real solver on the policy's own tasks ({len(audits)} audits, {trials} solver trials)</h3>"
        + image(figure, "probe reward and audited utility per step")
        + rows_table(keys, rows)
    )


def audit_curves(path: Path, entries: list[dict], audits: list[dict]) -> None:
    """Per step: the reward log's mean probe probability, and each audit's in-band rate and utility
    (with a 95% interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.5))
    probed = [e for e in entries if e.get("probe_probability_mean") is not None]
    axis.plot([e["step"] for e in probed], [e["probe_probability_mean"] for e in probed], label="probe probability")
    audits = [a for a in audits if "error" not in a]
    steps = [a["step"] for a in audits]
    utilities = [a["utility"] for a in audits]
    intervals = [1.96 * a["utility_se"] for a in audits]
    axis.errorbar(steps, utilities, yerr=intervals, marker="o", capsize=3, label="audited utility")
    banded = [a for a in audits if a["in_band_rate"] is not None]
    axis.plot([a["step"] for a in banded], [a["in_band_rate"] for a in banded], "s", label="audited in-band rate")
    axis.set_xlabel("step")
    axis.set_ylim(-0.05, 1.05)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


#: what a reward log entry says the rule paid an invalid and a cut-off generation
PAID = (("r_bad", "r_bad"), ("overflow_reward", "overflow reward"))


def rules_line(entries: list[dict]) -> str:
    """Which reward rule (with its options, and what it paid an invalid and a cut-off generation) gave
    the rewards, read from the reward log: each with the steps it rewarded, so an adapter trained under
    two (allow_changed_settings) says so."""
    steps: dict[str, list[int]] = defaultdict(list)
    for entry in entries:
        paid = "".join(f", {name} {entry[key]:g}" for key, name in PAID if isinstance(entry.get(key), int | float))
        steps[f"{entry.get('rule', '(not logged)')} {json.dumps(entry.get('rule_options') or {})}{paid}"].append(
            entry["step"]
        )
    parts = [f"<code>{html.escape(rule)}</code> (steps {min(s)}-{max(s)})" for rule, s in steps.items()]
    warning = " <span class='missing'>(more than one rule: this adapter mixes them)</span>" if len(parts) > 1 else ""
    return f"<p>Rewarded by {', '.join(parts)}{warning}.</p>"


def alarms(entries: list[dict]) -> str:
    """The alarms training raised (most completions cut off, or most groups of one reward, for steps in
    a row), as it said them."""
    said = [entry["alarm"] for entry in entries if entry.get("alarm")]
    return "".join(f"<p class='missing'>Alarm: {html.escape(line)}</p>" for line in said)


def completions_table(path: Path) -> str:
    """The last reward call's sampled completions with their rewards (``train/completions.jsonl``)."""
    if not path.exists():
        return ""
    calls = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not calls:
        return ""
    last = calls[-1]
    rows = [
        [
            float(c["reward"]),
            "cut off (length limit)" if c.get("overflow") else "valid" if c["valid"] else f"invalid: {c['reason']}",
            "" if c.get("probability") is None else float(c["probability"]),
            Markup(f"<span class='task'>{html.escape(c['generation'][:800])}</span>"),
        ]
        for c in last["completions"]
    ]
    return f"<h3>Completions of the last step ({last['step']}), sampled</h3>" + rows_table(
        ["reward", "validity", "probe p", "generation"], rows
    )


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
    if all("cut_off" in e for e in entries):  # logs written before it was recorded have none
        rate_axis.plot(calls, [e["cut_off"] for e in entries], marker="^", label="cut off at the length limit")
    rate_axis.set_ylim(-0.05, 1.05)
    rate_axis.set_xlabel("reward call")
    rate_axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def evaluation_section(root: Path) -> str:
    table_path = root / "eval" / "table.md"
    if not table_path.exists():
        return missing(root, "evaluate")
    lines = [line for line in table_path.read_text(errors="backslashreplace").splitlines() if line.strip()]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return rows_table(header, rows) + image(root / "eval" / "solve_counts.png", "solve-count histograms")


def examples_section(root: Path, k: int, per_bucket: int = 2) -> str:
    if not (root / "labels.jsonl").exists():
        return missing(root, "label")
    tasks = {task.id: task for task in iter_jsonl(root / "tasks.jsonl", Task)}
    buckets: dict[int, list[Task]] = defaultdict(list)  # -1: unknown, too few gradable attempts
    for label in iter_jsonl(root / "labels.jsonl", Label):
        solved = -1 if label.utility is None else sum(bool(a.solved) for a in label.attempts)
        if len(buckets[solved]) < per_bucket and label.task_id in tasks:
            buckets[solved].append(tasks[label.task_id])
    parts = []
    for solved in sorted(buckets):
        parts.append(f"<h3>solved {solved}/{k}</h3>" if solved >= 0 else "<h3>unknown (too few gradable attempts)</h3>")
        for task in buckets[solved]:
            text = task.text if isinstance(task.text, str) else "\n---\n".join(task.text or [])
            parts.append(f"<p class='task'>{html.escape(text)}</p>")
    return "".join(parts) or "<p>no labeled tasks.</p>"
