"""The frontier-shift experiment's bookkeeping (a miniature of the paper's Figure 2 and Table 3).

``benchmarks/frontier_shift.py`` runs the experiment; this module, beside it, turns its files into one
summary (the report stage reads the summary's file, ``RUN/experiment/frontier_shift.json``):
utility and the paper's other metrics per arm with standard errors across RL seeds, each trained
arm against base (a two-level paired bootstrap over seeds and contexts), solver trials and wall time
per arm, the probe's quality on held-out rows and on each arm's own tasks, and training curves.

The files, under ``RUN/experiment/``: ``ARM/seed-S/`` (a trained arm: ``reward_log.jsonl`` and
TRL's ``log.jsonl``), ``eval/seed-S/ARM/`` (``tasks.jsonl``, ``labels.jsonl``, ``probe_logits.json``: the
probe's metrics on that arm's labeled tasks) and ``timings.json`` (wall seconds of each piece).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections import Counter
from pathlib import Path

from propel_core.errors import PropelError
from propel_core.evaluation import arm_metrics, paired_comparison, per_context_utility, verdict_sentence
from propel_core.provenance import differences, flat
from propel_core.records import Label, Task, iter_jsonl
from propel_core.training.audit import read_records

#: the arms and the reward rule each trains with (base is not trained)
ARMS = {"base": None, "hard": "hard", "wco": "wco", "sil": "solver_in_the_loop"}
#: the arms that train (every arm but the untrained base)
TRAINED = tuple(arm for arm, rule in ARMS.items() if rule is not None)
#: arms whose reward reads probes, trained on the one labeled corpus
PROBE_ARMS = ("hard", "wco")
#: per-seed metrics averaged across seeds (each a (value, standard error) pair in arm_metrics)
SEED_METRICS = ("utility", "valid_rate", "self_bleu_3", "distinct_3", "top_topic_share")
#: per-step training diagnostics: reward_log.jsonl's keys, and TRL's kl
CURVE_KEYS = ("reward_mean", "reward_std", "validity_rate", "degenerate_groups", "kl")
FILE = "frontier_shift.json"
log = logging.getLogger("propel")


class Timings:
    """Wall seconds of each finished piece, saved at once: a piece found here is done. A piece that
    was interrupted keeps the seconds it had spent (``partial``), added when it finishes. The file
    also holds the config the pieces were made with; another config is refused, naming the keys."""

    def __init__(self, path: Path, config: dict):
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.exists() else {}
        made_with = self.data.setdefault("config", config)
        if made_with != config:
            changed = ", ".join(differences(flat(made_with), flat(config)))
            raise PropelError(
                f"{path.parent} was made with other settings ({changed}): use another run_dir, "
                f"or delete {path} to redo every piece"
            )

    def run(self, keys: tuple[str, ...], work) -> None:
        """Run ``work()`` unless the piece ``keys`` (e.g. ("train", "hard", "0")) is done."""
        name = "/".join(keys)
        node = self.data
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            log.info("%s: done before (%.0f s)", name, node)
            return
        spent = self.data.setdefault("partial", {}).pop(name, 0.0)
        start = time.perf_counter()
        try:
            work()
        except BaseException:  # Ctrl-C included: the seconds spent count when the piece is redone
            self.data["partial"][name] = spent + time.perf_counter() - start
            self._save()
            raise
        node = self.data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = spent + time.perf_counter() - start
        self._save()

    def _save(self) -> None:
        """Write the file whole or not at all (a crash mid-write leaves the previous one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, indent=2))
        os.replace(temporary, self.path)


def read_lines(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def corpus_trials(labels_path: Path) -> int:
    """Solver runs spent labeling a corpus: every attempt of every label."""
    return sum(len(label.attempts) for label in iter_jsonl(labels_path, Label))


def training_trials(folder: Path) -> int:
    """Solver runs spent inside RL (the solver_in_the_loop rule logs them per reward call)."""
    return sum(entry.get("solver_attempts", 0) for entry in read_lines(folder / "reward_log.jsonl"))


def training_curve(folder: Path) -> list[dict]:
    """Per step: the reward scorer's diagnostics joined with TRL's KL of the same step (TRL
    generates a step's rollouts at once, so the scorer is called once per step)."""
    kl = {int(entry["step"]) - 1: entry["kl"] for entry in read_lines(folder / "log.jsonl") if "kl" in entry}
    return [
        {key: entry.get(key) for key in CURVE_KEYS} | {"step": entry["step"], "kl": kl.get(entry["step"])}
        for entry in read_lines(folder / "reward_log.jsonl")
    ]


def mean_se(values: list[float]) -> dict:
    """Mean and standard error across seeds (0 with one seed)."""
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return {"mean": mean, "se": se, "per_seed": values}


def summarize(root: Path, seeds: list[int], k: int, setting: dict, timings: dict, trained=TRAINED) -> dict:
    """The experiment's summary from the files under ``root`` (``RUN/experiment``) of base and the
    ``trained`` arms; ``setting`` is recorded as it is, ``timings`` holds wall seconds (``corpus``: per
    piece, ``train``: per arm and seed, ``eval``: per arm and seed). Raises FileNotFoundError when an
    arm's evaluation is missing."""
    utilities: dict[str, list[float]] = {}
    keys: dict[str, list[tuple[int, str]]] = {}
    arms = {}
    for arm in ("base", *trained):
        arms[arm], utilities[arm], keys[arm] = _arm(root, arm, seeds, k, timings)
    for arm in trained:
        if keys[arm] != keys["base"]:
            counts = f"{len(keys[arm])} vs {len(keys['base'])} tasks"
            raise ValueError(
                f"the {arm} arm's evaluation tasks are not base's ({counts}, or other ids): "
                "rerun its evaluation with the same evaluate settings"
            )
        groups = [seed for seed, _ in keys[arm]]
        arms[arm]["vs_base"] = paired_comparison(utilities[arm], utilities["base"], groups=groups)
    unit = f"over {len(seeds)} seeds x {setting.get('eval_tasks_per_seed', '?')} contexts"
    return {
        "setting": setting,
        "verdict": verdict(arms, unit),
        "arms": arms,
        "probe": _probe(root.parent),
        "timings": timings,
    }


def _arm(root: Path, arm: str, seeds: list[int], k: int, timings: dict) -> tuple[dict, list, list]:
    """One arm's summary, its per-context utilities over all seeds, and the (seed, task id) of each."""
    per_seed, pooled, utilities, keys = [], Counter(), [], []
    for seed in seeds:
        folder = root / "eval" / f"seed-{seed}" / arm
        if not (folder / "tasks.jsonl").exists():
            raise FileNotFoundError(f"{folder / 'tasks.jsonl'}: the {arm} arm of seed {seed} was not evaluated")
        tasks = list(iter_jsonl(folder / "tasks.jsonl", Task))
        labels = list(iter_jsonl(folder / "labels.jsonl", Label))
        per_seed.append(arm_metrics(tasks, labels, k))
        pooled.update(dict(enumerate(per_seed[-1]["solve_counts"])))
        utilities += per_context_utility(tasks, labels)
        keys += [(seed, task_id) for task_id in sorted(task.id for task in tasks)]
    summary = {
        key: mean_se([m[key][0] for m in per_seed]) if all(m[key] is not None for m in per_seed) else None
        for key in SEED_METRICS
    }
    topics = Counter(m["top_topic"] for m in per_seed if m["top_topic"] is not None)
    summary |= {
        "generations_per_seed": [m["generations"] for m in per_seed],
        "valid": sum(m["valid"] for m in per_seed),
        "labeled": sum(m["labeled"] for m in per_seed),
        "in_band": sum(m["in_band"] for m in per_seed),
        "top_topic": topics.most_common(1)[0][0] if topics else None,
        "solve_counts": [pooled.get(count, 0) for count in range(k + 1)],
        "probe_on_tasks": _probe_on_tasks(root, arm, seeds),
    }
    trained, probed = ARMS[arm] is not None, arm in PROBE_ARMS
    online = statistics.fmean(training_trials(root / arm / f"seed-{seed}") for seed in seeds) if trained else 0
    offline = corpus_trials(root.parent / "labels.jsonl") if probed else 0
    summary["solver_trials"] = {"offline": offline, "online_per_seed": online, "total": offline + online}
    seconds = [timings.get("train", {}).get(arm, {}).get(str(seed)) for seed in seeds] if trained else []
    seconds = [s for s in seconds if s is not None]
    pieces = timings.get("corpus", {})
    corpus = sum(seconds for piece, seconds in pieces.items() if piece != "ensemble" or arm == "wco") if probed else 0.0
    train = statistics.fmean(seconds) if seconds else 0.0
    summary["wall_seconds"] = {"corpus": corpus, "train_per_seed": train, "total": corpus + train}
    if trained:  # what it paid invalid and cut-off generations (calibrated from the probe where the config says null)
        logged = read_lines(root / arm / f"seed-{seeds[0]}" / "reward_log.jsonl")[:1]
        summary |= {key: logged[0].get(key) if logged else None for key in ("r_bad", "overflow_reward")}
        summary["training"] = _mean_curve([training_curve(root / arm / f"seed-{seed}") for seed in seeds])
        audits = {str(seed): read_records(root / arm / f"seed-{seed}") for seed in seeds}
        if any(audits.values()):  # train.audit was on for this arm: its solver runs are spent too
            fields = ("step", "utility", "in_band_rate", "probe_probability", "gap", "trials", "error")
            summary["audits"] = {seed: [{f: r.get(f) for f in fields} for r in rs] for seed, rs in audits.items()}
            spent = statistics.fmean(sum(r.get("trials") or 0 for r in rs) for rs in audits.values())
            summary["solver_trials"] |= {"audit_per_seed": spent, "total": summary["solver_trials"]["total"] + spent}
    return summary, utilities, keys


def verdict(arms: dict[str, dict], unit: str) -> str:
    """One sentence: which trained arms moved utility off base, by how much, with what certainty."""
    comparisons = {arm: summary["vs_base"] for arm, summary in arms.items() if "vs_base" in summary}
    utilities = {arm: summary["utility"]["mean"] for arm, summary in arms.items()}
    return verdict_sentence(comparisons, utilities["base"], utilities, unit)


def _mean_curve(curves: list[list[dict]]) -> list[dict]:
    """Each step's diagnostics averaged over the seeds that logged that step."""
    steps = max((len(curve) for curve in curves), default=0)
    out = []
    for index in range(steps):
        entries = [curve[index] for curve in curves if len(curve) > index]
        row = {"step": index, "seeds": len(entries)}
        for key in CURVE_KEYS:
            values = [e[key] for e in entries if e.get(key) is not None]
            row[key] = statistics.fmean(values) if values else None
        out.append(row)
    return out


def _probe_on_tasks(root: Path, arm: str, seeds: list[int]) -> dict | None:
    """The probe on this arm's own labeled tasks, pooled over seeds: its metrics, its mean
    probability beside the real in-band rate, and the rows they were measured on."""
    import torch

    from propel_core.probes.metrics import metrics

    utility, logits, rates = [], [], []
    for seed in seeds:
        folder = root / "eval" / f"seed-{seed}" / arm
        if not (folder / "probe_logits.json").exists():
            return None
        scored = json.loads((folder / "probe_logits.json").read_text())
        for label in iter_jsonl(folder / "labels.jsonl", Label):
            if label.task_id in scored:
                utility.append(float(label.utility))
                logits.append(scored[label.task_id])
                rates.append(label.solve_rate)
    if not utility:
        return {"rows": 0}
    y, x = torch.tensor(utility), torch.tensor(logits)
    found = metrics(y, x, torch.tensor(rates, dtype=torch.float)) if len(set(utility)) == 2 else {}
    found = {key: value if math.isfinite(value) else None for key, value in found.items()}
    return found | {
        "rows": len(utility),
        "mean_probability": float(torch.sigmoid(x).mean()),
        "in_band_rate": float(y.mean()),
    }


def _probe(run_dir: Path) -> dict:
    """The selected probe and the ensemble's other members: cell and held-out metrics, with rows."""
    out = {}
    bundles = {"selected": run_dir / "probes" / "selected"}
    bundles |= {p.name: p for p in sorted((run_dir / "experiment" / "ensemble").glob("seed-*"))}
    for name, folder in bundles.items():
        path = folder / "probe.json"
        if path.exists():
            description = json.loads(path.read_text())
            out[name] = {key: description[key] for key in ("layer", "pooling", "architecture", "training_rows")}
            out[name]["metrics"] = description["metrics"]
    return out


def figures(summary: dict, folder: Path, band) -> dict[str, Path]:
    """The experiment's pictures: utility per arm with ±1 SE over seeds beside the solver trials each
    arm spent (the paper's Figure 2 and Table 3 in one), training curves per arm, and the pooled
    solve-count histograms with the band shaded. Returns their paths by name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from propel_core.evaluation import histogram_plot, share

    arms = summary["arms"]
    names = list(arms)
    paths = {name: folder / f"{name}.png" for name in ("utility", "curves", "solve_counts")}
    figure, (utility_axis, trials_axis) = plt.subplots(1, 2, figsize=(9, 3.6))
    seeds = len(summary["setting"]["seeds"])
    utility_axis.bar(
        names,
        [arms[a]["utility"]["mean"] for a in names],
        yerr=[arms[a]["utility"]["se"] for a in names],
        capsize=5,
        color="#4878a8",
    )
    utility_axis.set_ylabel("utility (share of generations in band)")
    utility_axis.set_title(f"utility, ±1 SE over {seeds} RL seeds")
    offline = [arms[a]["solver_trials"]["offline"] for a in names]
    online = [arms[a]["solver_trials"]["online_per_seed"] for a in names]
    trials_axis.bar(names, offline, color="#8c8c8c", label="offline (labeling the corpus)")
    trials_axis.bar(names, online, bottom=offline, color="#d0743c", label="online (inside RL, per seed)")
    trials_axis.set_ylabel("solver trials")
    trials_axis.set_title("solver trials per arm")
    trials_axis.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(paths["utility"], dpi=110)
    plt.close(figure)

    trained = [a for a in names if arms[a].get("training")]
    figure, axes = plt.subplots(1, 3, figsize=(11, 3.3))
    for arm in trained:
        curve = arms[arm]["training"]
        steps = [row["step"] + 1 for row in curve]
        axes[0].plot(steps, [row["reward_mean"] for row in curve], marker=".", label=arm)
        axes[1].plot(steps, [row["validity_rate"] for row in curve], marker=".", label=arm)
        axes[2].plot(steps, [row["kl"] for row in curve], marker=".", label=arm)
    for axis, title in zip(axes, ("reward mean (own scale per rule)", "validity rate", "KL to the base"), strict=True):
        axis.set_title(title)
        axis.set_xlabel("GRPO step (mean over seeds)")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(paths["curves"], dpi=110)
    plt.close(figure)

    pooled = {
        arm: {
            "labeled": sum(arms[arm]["solve_counts"]),
            "solve_count_shares": [share(c, sum(arms[arm]["solve_counts"])) for c in arms[arm]["solve_counts"]],
        }
        for arm in names
    }
    histogram_plot(paths["solve_counts"], pooled, len(arms[names[0]]["solve_counts"]) - 1, band)
    return paths
