"""report: one self-contained HTML page about the run -> ``RUN/report.html``.

The page answers two questions for any run, finished or stopped early: did the probe reward move
utility, and can the probe be trusted? It opens with a header (the generator, the solver, said to be
simulated where no model answers, and the reference the probe reads) and, where the run is not
finished, a banner naming each stage not run, interrupted or refused with the command that finishes
it. Then utility per arm with its interval and a one-sentence verdict (from the frontier-shift
experiment, ``benchmarks/frontier_shift.py``, when the run folder holds one; else from ``propel
evaluate``); the probe's held-out metrics beside the training audits' on the policy's own tasks, with
a verdict (:func:`probe_verdict`); per stage, the solver attempts and wall time it took
(``RUN/timings.json``). Then the evidence: the probe's quality on held-out rows (and, in an
experiment, on each arm's own tasks), the reward rule in words, training curves, solve-count
histograms, the data funnel and example tasks; the config comes last, folded. Every metric carries
the rows it was measured on, and one measured on fewer than 30 says so. Pictures are embedded as data
URIs, so the page can be mailed or attached as it is. A section whose stage has not run says which
stage to run, and why it did not run where a stage refused (``RUN/refusals.json``, kept by
:func:`propel_core.provenance.record_refusal`). Each section is a function returning its HTML; a
command that adds one adds it to :func:`pipeline_sections`.
"""

from __future__ import annotations

import base64
import html
import inspect
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from propel_core.config import PropelConfig, dump_config
from propel_core.evaluation import evaluation_verdict, rounds_curve, shift_text
from propel_core.execution import ungradable_line
from propel_core.plugins import Registry
from propel_core.provenance import refusals, stage_times
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
.banner { background: #fdecea; border-left: 4px solid #b3261e; padding: .3em .9em; }
"""


def report(run: Run) -> None:
    """Write one self-contained HTML page on the run -> report.html: the header (who generated,
    solved and was read), a banner for what is missing or interrupted, then the sections."""
    root = run.dir
    experiment = root / EXPERIMENT
    if experiment.exists():
        summary = json.loads(experiment.read_text())
        sections = experiment_sections(run, summary, experiment.parent)
        banner = ""  # the experiment's pieces are the benchmark's to finish (benchmarks/experiment.py)
    else:
        states = stage_states(run)
        sections = pipeline_sections(run, states)
        banner = banner_section(states)
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
    name = html.escape(root.resolve().name)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>propel report: {name}</title>"
        f"<style>{STYLE}</style></head><body><h1>propel report: {name}</h1>"
        f"{header_section(run)}{banner}{body}</body></html>"
    )
    write_readable(root / "report.html", page)
    run.say(f"report: {root / 'report.html'}")


def experiment_sections(run: Run, summary: dict, folder: Path) -> list[tuple[str, str]]:
    """The sections of a run folder holding the frontier-shift experiment, before the common ones."""
    root = run.dir
    return [
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


def pipeline_sections(run: Run, states: list[StageState]) -> list[tuple[str, str]]:
    """The sections of a pipeline run, before the common ones: each is (title, HTML) from a function
    of its own, so a command that adds a section adds one line here."""
    root = run.dir
    selected = main_probe(run.services, run.config.reward)
    sections = [
        ("Does it work? Base vs trained (real solver runs)", headline_section(root)),
        ("Can I trust the probe? Held-out rows vs the policy's own tasks", trust_section(root, selected)),
        ("Stages: what ran, solver attempts, wall time", stages_section(states)),
        ("Probe quality", probe_section(root, selected)),
        ("Training", training_section(root, run.registry, run.config.train.steps)),
        ("Solve counts, base vs trained", evaluation_section(root)),
    ]
    if (root / "rounds").exists():
        sections.insert(1, ("Rounds: does the solver learn, and does the frontier follow it?", rounds_section(root)))
    return sections


def header_section(run: Run) -> str:
    """Who wrote the tasks, who solved them (a simulated solver said so) and which frozen model the
    probe reads (the bundle's own, where there is one), and where the run folder is."""
    config = run.config
    bundle = main_probe(run.services, config.reward) / "probe.json"
    reference = json.loads(bundle.read_text())["reference_model"] if bundle.exists() else config.reference.shown
    solver = config.solver.shown + (
        " (simulated: no model answers; its solve rates are the backend's own)"
        if config.solver.simulated
        else f" (a real model, {config.solver.backend} backend)"
    )
    rows = [
        ["generator", config.generator.shown],
        ["solver", solver],
        ["reference (the frozen model the probe reads)", reference],
        ["domain", config.domain.name],
        ["run folder", str(run.dir)],
    ]
    return rows_table(["", ""], rows)


@dataclass
class StageState:
    """What one pipeline stage has left in the run folder: ``done`` when its output is whole;
    ``state`` in words; ``finish``, the command that finishes it (None where nothing is to run; a
    stage's check gives only what follows ``propel STAGE CONFIG``, "" for nothing); the solver
    attempts its records hold, and the wall time and last ending ``RUN/timings.json`` gives it."""

    name: str
    done: bool
    state: str
    finish: str | None = None
    attempts: int = 0
    #: what ``finish`` does, as the banner says it
    how: str = "to finish"
    seconds: float | None = None
    ended: str | None = None


def stage_states(run: Run) -> list[StageState]:
    """Each stage of ``propel run`` but the report, as the run folder holds it."""
    root, config = run.dir, run.config
    saved = root / "config.yaml"
    command = str(saved) if saved.exists() else "CONFIG"
    found, timed = refusals(root), stage_times(root)
    borrowed = config.reward.main_probe
    states = []
    for name in STAGE_ORDER:
        if borrowed and name in CORPUS and not (root / CORPUS[name]).exists():
            state = StageState(name, True, f"not needed: the reward reads {borrowed}")
        else:
            state = STAGE_CHECKS[name](root, config)
        if state.finish is not None:
            state.finish = f"propel {name} {command}{state.finish}"
        if name in found:
            state.done = False
            state.state = f"refused: {found[name]['reason']}"
            state.finish = f"propel {name} {command}"
        blocked = [before for before, refusal in found.items() if name in refusal["blocks"]]
        if blocked and not state.done:
            state.state += f" (comes after propel {blocked[-1]}, which refused)"
        state.seconds, state.ended = timed.get(name, {}).get("seconds"), timed.get(name, {}).get("ended")
        states.append(state)
    return states


def generate_state(root: Path, config: PropelConfig) -> StageState:
    planned = config.generate.num_tasks
    count = _lines(root / "tasks.jsonl")
    if count >= planned:
        return StageState("generate", True, f"{count} tasks")
    return StageState("generate", False, f"{count} of {planned} tasks" if count else "not run", "")


def label_state(root: Path, config: PropelConfig) -> StageState:
    valid = (
        sum(task.validity.valid for task in iter_jsonl(root / "tasks.jsonl", Task))
        if (root / "tasks.jsonl").exists()
        else 0
    )
    labels = list(iter_jsonl(root / "labels.jsonl", Label)) if (root / "labels.jsonl").exists() else []
    attempts = sum(len(label.attempts) for label in labels)
    if labels and len(labels) >= valid:
        return StageState("label", True, f"{len(labels)} tasks labeled, K={config.label.k}", attempts=attempts)
    shown = f"{len(labels)} of {valid} valid tasks labeled" if labels else "not run"
    return StageState("label", False, shown, "", attempts)


def extract_state(root: Path, config: PropelConfig) -> StageState:
    if (root / "activations" / "index.json").exists():
        return StageState("extract", True, "activations of every parsed task")
    started = (root / "activations").exists()
    return StageState("extract", False, "interrupted: no index.json yet" if started else "not run", "")


def probe_state(root: Path, config: PropelConfig) -> StageState:
    if (root / "probes" / "selected" / "probe.json").exists():
        return StageState("probe", True, "a probe selected")
    return StageState("probe", False, "not run", "")


def train_state(root: Path, config: PropelConfig) -> StageState:
    planned = config.train.steps
    log_path = root / "train" / "reward_log.jsonl"
    steps = len({entry["step"] for entry in _entries(log_path)}) if log_path.exists() else 0
    attempts = sum(audit.get("trials", 0) for audit in read_records(root / "train"))
    finished = (root / "train" / "adapter").exists()
    if finished and steps >= planned:
        return StageState("train", True, f"{steps} of {planned} steps", attempts=attempts)
    audit = config.train.audit
    if finished and (audit.stop_gap is not None or audit.stop_drop is not None):
        said = f"stopped at step {steps} of {planned} by an audit's stop rule (train.audit); a rerun does not "
        return StageState("train", False, said + "train past it", " checkpoint.resume=false", attempts, "to start over")
    if not steps:
        return StageState("train", False, "not run", "")
    return StageState("train", False, f"interrupted at step {steps} of {planned}", "", attempts)


def evaluate_state(root: Path, config: PropelConfig) -> StageState:
    folder = root / "eval"
    attempts = sum(
        len(label.attempts) for path in sorted(folder.glob("*/labels.jsonl")) for label in iter_jsonl(path, Label)
    )
    if (folder / "metrics.json").exists():
        arms = ", ".join(json.loads((folder / "metrics.json").read_text()))
        return StageState("evaluate", True, f"arms {arms}, {config.evaluate.num_tasks} tasks each", attempts=attempts)
    return StageState("evaluate", False, "interrupted: no metrics.json yet" if attempts else "not run", "", attempts)


#: how each stage of ``propel run`` but the report is judged from its files (the report writes itself)
STAGE_CHECKS = {
    "generate": generate_state,
    "label": label_state,
    "extract": extract_state,
    "probe": probe_state,
    "train": train_state,
    "evaluate": evaluate_state,
}
STAGE_ORDER = tuple(STAGE_CHECKS)
#: the stages that make the run's own probe, each with its output: not needed where reward.main_probe
#: names another run's probe (unless they ran here anyway)
CORPUS = {"generate": "tasks.jsonl", "label": "labels.jsonl", "extract": "activations", "probe": "probes"}


def _lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip()) if path.exists() else 0


def _entries(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def banner_section(states: list[StageState]) -> str:
    """One line per stage that has not finished (not run, interrupted, refused or stopped), each with
    the command that finishes it; nothing when every stage has."""
    lines = [
        f"<li><b>{state.name}</b>: {html.escape(state.state)}"
        + (f" &mdash; {state.how}: <code>{html.escape(state.finish)}</code>" if state.finish else "")
        + "</li>"
        for state in states
        if not state.done
    ]
    if not lines:
        return ""
    return f"<div class='banner'><p>This run is not finished:</p><ul>{''.join(lines)}</ul></div>"


def stages_section(states: list[StageState]) -> str:
    """Per stage: what its files hold, the solver attempts they record (label, the training's audits,
    evaluate) and its wall time over every run of it that ended (``RUN/timings.json``)."""
    rows = [
        [
            state.name,
            state.state,
            state.attempts,
            "-" if state.seconds is None else Markup(f"<span class='seconds'>{state.seconds:.1f}</span>"),
            state.ended or "-",
        ]
        for state in states
    ]
    note = (
        "<p>Solver attempts: the label stage's K per valid task, the training audits' (train.audit) and "
        "the evaluation's. Wall time: every run of the stage that ended, added up; a stage run by a script "
        "rather than a <code>propel</code> command, or killed outright, has none recorded.</p>"
    )
    return rows_table(["stage", "state", "solver attempts", "wall s", "last run"], rows) + note


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


#: the probe verdict's rule (docs/cli.md, "propel report"): the on-policy AUROC (the training audits',
#: on the policy's own tasks) must reach USEFUL_AUC, about the cross-validated AUC of the probe the
#: paper's SWE runs rewarded with and still moved utility (0.596, appendix 14, table 11), and fall no
#: more than TRANSFER_DROP below the held-out AUC: the paper's limitation (section 7) that a fixed
#: probe degrades under policy drift, and its appendix 12's false positives, are what such a fall
#: measures
USEFUL_AUC = 0.6
TRANSFER_DROP = 0.1


def probe_verdict(
    held_out: float | None,
    on_policy: float | None,
    rows: int,
    gap: float | None,
    audited: int = 0,
    held_rows: float | None = None,
) -> str:
    """One sentence on whether the probe's reward can be trusted: its held-out AUC against the AUROC
    the audits measured on ``rows`` of the policy's own tasks (None: none measured one), and the mean
    calibration gap (probe probability minus the real in-band rate) that tells an exploited probe
    (positive: the policy pleases it) from one that does not transfer. ``audited``: the audits that
    ran, an AUROC or not (one needs tasks on both sides of the band); ``held_rows``: the held-out rows
    per split the held-out AUC is the mean over."""
    if held_out is None:
        return "No verdict: there is no selected probe with a held-out AUC yet."
    if held_out < USEFUL_AUC:
        return (
            f"Do not trust it: its held-out AUC, {held_out:.2f}, is below {USEFUL_AUC}; it hardly tells in-band "
            "tasks from the rest even on the corpus it was fitted to."
            + (
                f" Measured on {held_rows:.0f} held-out rows a split only: label more tasks before reading it."
                if held_rows is not None and held_rows < FEW_ROWS
                else ""
            )
        )
    if on_policy is None:
        if not audited:
            why = "no audit ran (set train.audit.every)"
        else:
            ran = f"{audited} audit{'s' if audited > 1 else ''}"
            why = f"the {ran} that ran had no tasks on both sides of the band, which an AUROC needs"
            if gap is not None:
                why += f" (calibration gap {gap:+.2f}: the probe's probability less the real in-band rate)"
        return (
            f"Not checked on the policy's own tasks: held-out AUC {held_out:.2f}, but {why}, so nothing says "
            "whether the policy exploits the probe."
        )
    few = f" Measured on {rows} rows only: too few to tell for sure." if rows < FEW_ROWS else ""
    if on_policy >= USEFUL_AUC and on_policy >= held_out - TRANSFER_DROP:
        return (
            f"Trust it: on the policy's own tasks its AUROC is {on_policy:.2f}, at least {USEFUL_AUC} and no more "
            f"than {TRANSFER_DROP} below the held-out {held_out:.2f}.{few}"
        )
    why = (
        f"the policy is exploiting it: its probability runs {gap:+.2f} above the real in-band rate"
        if gap is not None and gap > 0
        else "it does not transfer to the tasks the policy now writes"
    )
    return (
        f"Do not trust it: on the policy's own tasks its AUROC is {on_policy:.2f} against {held_out:.2f} held "
        f"out (the rule: at least {USEFUL_AUC} and no more than {TRANSFER_DROP} below held-out); {why}.{few}"
    )


def trust_section(root: Path, selected: Path) -> str:
    """The selected probe's held-out metrics beside the training audits' on the policy's own tasks,
    and the verdict (:func:`probe_verdict`). The audits' AUROC is their mean weighted by the labeled
    rows each measured it on."""
    bundle = selected / "probe.json"
    found = json.loads(bundle.read_text())["metrics"] if bundle.exists() else {}
    audits = [a for a in read_records(root / "train") if "error" not in a]  # an AUROC or not
    rows = audit_rows(root / "train")

    def mean(key: str) -> tuple[float | None, int | None]:
        """The audits' ``key``, weighted by their rows, and those rows (None: not journaled)."""
        values = [(a[key], rows.get(a["step"], 0)) for a in audits if a.get(key) is not None]
        weight = sum(w for _, w in values)
        if not weight:  # none, or their rows not journaled: each audit counts alike
            return (statistics.fmean(value for value, _ in values) if values else None), None
        return sum(value * w for value, w in values) / weight, weight

    held_rows, (auroc, total), (gap, gap_rows) = found.get("test_rows"), mean("auroc"), mean("gap")
    steps = ", ".join(str(a["step"] + 1) for a in audits) or "none"
    table = rows_table(
        ["", "held-out rows (the probe sweep's selected cell)", f"the policy's own tasks (audits at steps {steps})"],
        [
            ["AUC", with_n(found.get("test_auc"), held_rows), with_n(auroc, total)],
            [
                "balanced accuracy",
                with_n(found.get("test_balanced_accuracy"), held_rows),
                with_n(*mean("balanced_accuracy")),
            ],
            ["probe probability - real in-band rate (calibration gap)", "-", with_n(gap, gap_rows)],
        ],
    )
    sentence = probe_verdict(found.get("test_auc"), auroc, total or 0, gap, audited=len(audits), held_rows=held_rows)
    return f"<p class='verdict'>{html.escape(sentence)}</p>" + table


def audit_rows(folder: Path) -> dict[int, int]:
    """Per audited step, the labeled tasks with a known utility (``audit/labels.jsonl``): the rows an
    audit's AUROC was measured on."""
    path = folder / "audit" / "labels.jsonl"
    counts: dict[int, int] = defaultdict(int)
    for label in iter_jsonl(path, Label) if path.exists() else []:
        if label.utility is not None:
            counts[int(label.task_id.split("-")[1])] += 1  # the reward function names them rl-STEP-I
    return counts


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


def training_section(root: Path, registry: Registry, planned: int) -> str:
    """The reward rule in words, the alarms, curves, sampler, audits and last completions of the
    training in ``root/train`` (``planned``: the steps it was to take)."""
    log_path = root / "train" / "reward_log.jsonl"
    if not log_path.exists():
        return missing(root, "train")
    entries = _entries(log_path)
    curves = root / "train" / "curves.png"
    training_curves(curves, entries)
    section = rules_line(entries, registry, planned) + alarms(entries) + image(curves, "training curves")
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


def rules_line(entries: list[dict], registry: Registry, planned: int) -> str:
    """Which reward rule gave the rewards, in words: its name and what it pays (the first paragraph of
    its docstring), its options, what it paid an invalid and a cut-off generation, and the steps it
    rewarded of the ``planned`` ones, read from the reward log: one sentence per rule, so an adapter
    trained under two (allow_changed_settings) says so."""
    steps: dict[tuple[str, str], list[int]] = defaultdict(list)
    for entry in entries:
        paid = [f"{name} {entry[key]:g}" for key, name in PAID if isinstance(entry.get(key), int | float)]
        options = ", ".join(f"{key} {json.dumps(value)}" for key, value in (entry.get("rule_options") or {}).items())
        said = f"options {options}" if options else "no options"
        if paid:
            said += "; it paid an invalid generation " + " and a cut-off one ".join(paid)
        steps[(entry.get("rule", "(not logged)"), said)].append(entry["step"])
    parts = []
    for (rule, said), rewarded in steps.items():
        known = rule in registry.names("reward_rules")
        words = (inspect.getdoc(registry.get("reward_rules", rule)) or "") if known else ""
        what = words.split("\n\n")[0].replace("\n", " ").rstrip(".") or "(the rule does not say what it pays)"
        parts.append(
            f"<p>Rewarded by the <code>{html.escape(rule)}</code> rule at steps {min(rewarded) + 1}-"
            f"{max(rewarded) + 1} of {planned} planned: {html.escape(what)} ({html.escape(said)}).</p>"
        )
    warning = "<p class='missing'>More than one rule: this adapter mixes them.</p>" if len(parts) > 1 else ""
    return "".join(parts) + warning


def alarms(entries: list[dict]) -> str:
    """The alarms training raised (most completions cut off, or most groups of one reward, for steps in
    a row), as it said them."""
    said = [entry["alarm"] for entry in entries if entry.get("alarm")]
    return "".join(f"<p class='missing'>Alarm: {html.escape(line)}</p>" for line in said)


def completions_table(path: Path) -> str:
    """The last reward call's sampled completions with their rewards (``train/completions.jsonl``)."""
    if not path.exists():
        return ""
    calls = _entries(path)
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


def rounds_section(root: Path) -> str:
    """``propel rounds``: per round, the trained solver's held-out score (round 0: the base solver's)
    and the real in-band rate of the round's tasks for the solver the generator was trained for and
    for the trained one, as a figure and a table (:func:`~propel_core.evaluation.rounds_curve`)."""
    rows = rounds_curve(root / "rounds")
    if len(rows) < 2:
        return "<p>No round has finished yet: <code>propel rounds CONFIG</code> goes on where it stopped.</p>"
    rounds_figure(root / "rounds" / "rounds.png", rows)
    table = [
        [
            row["round"],
            Markup(f"{row['score']:.3f} [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]"),
            shift_of(row),
            _number(row.get("in_band_previous")),
            _number(row.get("in_band_trained")),
            _number(row.get("probe_auc")),
            _number(row.get("generator_reward")),
            row["attempts"],
            "" if row.get("seconds") is None else Markup(f"<span class='seconds'>{row['seconds']}</span>"),
        ]
        for row in rows
    ]
    header = [
        "round",
        "held-out score [95%]",
        "vs the base solver [95%]",
        "in band: solver before",
        "in band: trained solver",
        "probe AUC on the round's labels",
        "generator's probe reward",
        "solver attempts so far",
        "seconds",
    ]
    return image(root / "rounds" / "rounds.png", "held-out score and in-band rate per round") + rows_table(
        header, table
    )


def shift_of(row: dict) -> str:
    if "vs_base" not in row:
        return ""
    low, high = row["vs_base_ci95"]
    return f"{row['vs_base']:+.3f} [{low:+.3f}, {high:+.3f}]"


def rounds_figure(path: Path, rows: list[dict]) -> None:
    """The held-out score per round with its interval, and each round's in-band rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (score, band) = plt.subplots(1, 2, figsize=(10, 3.5))
    low = [row["score"] - row["ci95"][0] for row in rows]
    high = [row["ci95"][1] - row["score"] for row in rows]
    score.errorbar(
        [row["round"] for row in rows], [row["score"] for row in rows], yerr=[low, high], marker="o", capsize=3
    )
    score.set(xlabel="round (0: the base solver)", ylabel="held-out average score", ylim=(-0.05, 1.05))
    later = rows[1:]
    for key, label in (("in_band_previous", "for the solver before"), ("in_band_trained", "for the trained solver")):
        kept = [row for row in later if row.get(key) is not None]
        band.plot([row["round"] for row in kept], [row[key] for row in kept], marker="o", label=label)
    band.set(xlabel="round", ylabel="in-band rate of the round's tasks", ylim=(-0.05, 1.05))
    band.legend()
    for axis in (score, band):
        axis.xaxis.get_major_locator().set_params(integer=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
