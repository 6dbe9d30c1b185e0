"""Metrics of a generator arm (paper section 4.1): utility, validity, diversity, solve counts.

Every metric comes with a standard error. Texts are split on whitespace for the n-gram metrics.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from propel_core.errors import NotEnoughData
from propel_core.records import Label, Task, iter_jsonl

#: an evaluation draws its contexts and sampling seeds from the run's seed plus this, so the base arm
#: writes fresh tasks rather than repeating the labeled corpus (every arm shares them)
EVALUATION_SEED_OFFSET = 1_000_003


def evaluation_seed(seed: int, shift: int = 0) -> int:
    """The seed an evaluation of a run seeded ``seed`` samples and solves with; one evaluation per RL
    seed shifts it by that seed, so each draws its own fresh contexts."""
    return seed + EVALUATION_SEED_OFFSET + shift


def ngrams(tokens: Sequence[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def self_bleu(texts: Sequence[str], n: int = 3) -> tuple[float, float]:
    """Self-BLEU-n: each text's BLEU-n (uniform weights over 1..n-grams, clipped counts, brevity
    penalty against the closest reference length) with every other text as a reference; the mean
    and its standard error over texts. Higher means less diverse. Needs at least two texts.

    The clip count of an n-gram is its largest count in any *other* text; keeping each n-gram's
    two largest counts gives that in one pass, so the cost grows linearly with the corpus.
    """
    tokens = [text.split() for text in texts]
    if len(tokens) < 2:
        raise ValueError("Self-BLEU needs at least two texts")
    counts = [[ngrams(t, order) for order in range(1, n + 1)] for t in tokens]
    top: list[dict[tuple, list[tuple[int, int]]]] = [{} for _ in range(n)]  # n-gram -> two (count, text)
    for index, per_order in enumerate(counts):
        for order, grams in enumerate(per_order):
            for gram, count in grams.items():
                best = top[order].setdefault(gram, [])
                best.append((count, index))
                best.sort(reverse=True)
                del best[2:]
    lengths = sorted((len(t), i) for i, t in enumerate(tokens))
    scores = []
    for index, per_order in enumerate(counts):
        log_precision = 0.0
        for order, grams in enumerate(per_order):
            total = sum(grams.values())
            matched = sum(min(count, _max_elsewhere(top[order][gram], index)) for gram, count in grams.items())
            if total == 0 or matched == 0:
                log_precision = -math.inf
                break
            log_precision += math.log(matched / total) / n
        length = len(tokens[index])
        closest = min((abs(other - length), other) for other, i in lengths if i != index)[1]
        penalty = 1.0 if length > closest else math.exp(1 - closest / length) if length else 0.0
        scores.append(penalty * math.exp(log_precision))
    return _mean_se(scores)


def _max_elsewhere(best: list[tuple[int, int]], index: int) -> int:
    """The largest count held by a text other than ``index``."""
    return next((count for count, holder in best if holder != index), 0)


def distinct(texts: Sequence[str], n: int = 3, resamples: int = 200, seed: int = 0) -> tuple[float, float]:
    """Distinct-n: unique n-grams over all n-grams in the corpus; the standard error is a bootstrap
    over texts (seeded, so a rerun gives the same figure)."""
    grams = [ngrams(text.split(), n) for text in texts]

    def ratio(sample: Sequence[Counter]) -> float:
        pooled = Counter()
        for counter in sample:
            pooled.update(counter)
        total = sum(pooled.values())
        return len(pooled) / total if total else 0.0

    value = ratio(grams)
    if len(grams) < 2:
        return value, 0.0
    rng = random.Random(seed)
    boot = [ratio(rng.choices(grams, k=len(grams))) for _ in range(resamples)]
    return value, statistics.stdev(boot)  # the spread of the bootstrap statistic is its standard error


def share(hits: int, total: int) -> tuple[float, float]:
    """A proportion and its binomial standard error."""
    if total == 0:
        return 0.0, 0.0
    p = hits / total
    return p, math.sqrt(p * (1 - p) / total)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


def arm_metrics(tasks: list[Task], labels: list[Label], k: int) -> dict:
    """All metrics of one arm: ``tasks`` are every generation, ``labels`` the solver's on valid ones.
    Each rate is a (value, standard error) pair; a metric the arm has too few tasks for is None.

    Utility is the share of *all* generations that are valid and in band (the paper's denominator),
    so an arm cannot raise it by writing fewer valid tasks.
    """
    valid = [task for task in tasks if task.validity.valid]
    in_band = sum(label.utility == 1 for label in labels)
    # a trajectory's turns are read as one text
    texts = [task.text if isinstance(task.text, str) else "\n".join(task.text) for task in valid if task.text]
    topics = Counter(task.topic for task in valid if task.topic is not None)
    # a task with too few gradable attempts has no solve count (it is not solved 0 times)
    known = [label for label in labels if label.utility is not None]
    solved = Counter(sum(bool(a.solved) for a in label.attempts) for label in known)
    metrics = {
        "generations": len(tasks),
        "valid": len(valid),
        "labeled": len(labels),
        "in_band": in_band,
        "utility": share(in_band, len(tasks)),
        "valid_rate": share(len(valid), len(tasks)),
        "self_bleu_3": self_bleu(texts) if len(texts) >= 2 else None,
        "distinct_3": distinct(texts) if texts else None,
        "top_topic": topics.most_common(1)[0][0] if topics else None,
        "top_topic_share": share(topics.most_common(1)[0][1], sum(topics.values())) if topics else None,
        "solve_counts": [solved.get(count, 0) for count in range(k + 1)],
        "solve_count_shares": [share(solved.get(count, 0), len(known)) for count in range(k + 1)],
        "unknown": len(labels) - len(known),
    }
    return metrics


def per_context_utility(tasks: list[Task], labels: list[Label]) -> list[float]:
    """1.0 where the task is valid and in band, else 0.0, in task-id order: task ``i`` of an arm is
    written from context ``i``, and every arm of an evaluation writes from the same contexts, so two
    arms' lists pair up context by context for :func:`paired_comparison`."""
    in_band = {label.task_id for label in labels if label.utility == 1}
    return [float(task.validity.valid and task.id in in_band) for task in sorted(tasks, key=lambda t: t.id)]


def verdict_sentence(comparisons: dict[str, dict], base: float, utilities: dict[str, float], unit: str) -> str:
    """One sentence per trained arm: raised, lowered or did not clearly change utility, by whether
    the 95% interval excludes 0: the t-interval over groups (RL seeds) where the comparison has one
    (with few seeds the two-level bootstrap is too narrow), else the paired bootstrap interval."""
    parts = []
    for arm, comparison in comparisons.items():
        low, high = comparison.get("seed_t95") or comparison["ci95"]
        direction = "raised" if low > 0 else "lowered" if high < 0 else "did not clearly change"
        kind = f"t-interval over {comparison['groups']} seeds" if comparison.get("seed_t95") else "paired bootstrap"
        change = comparison["mean_difference"]
        parts.append(
            f"{arm} {direction} utility ({base:.3f} -> {utilities[arm]:.3f}, {change:+.3f}, "
            f"95% {kind} [{low:+.3f}, {high:+.3f}], {unit})"
        )
    return "Against the base generator, " + "; ".join(parts) + "."


def shift_text(comparison: dict | None) -> str:
    """A comparison as 'mean difference [low, high]' (the bootstrap interval), or '-' for none."""
    if comparison is None:
        return "-"
    low, high = comparison["ci95"]
    return f"{comparison['mean_difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def evaluation_verdict(results: dict[str, dict]) -> str:
    """The verdict of ``propel evaluate``'s metrics (``eval/metrics.json``): every trained arm
    against base, paired over the evaluation's contexts."""
    utilities = {arm: values["utility"][0] for arm, values in results.items()}
    comparisons = {arm: values["vs_base"] for arm, values in results.items() if "vs_base" in values}
    unit = f"paired over {results['base']['generations']} contexts"
    return verdict_sentence(comparisons, utilities["base"], utilities, unit)


#: the k of the pass@k a solver's held-out evaluation reports (those up to its attempts)
PASS_AT = (1, 4, 8, 16)


def solver_metrics(counts: list[int], k: int) -> dict[str, float]:
    """Average score, unbiased pass@k for k in 1, 4, 8, 16 (those <= attempts), zero-success rate."""
    metrics = {"average_score": sum(counts) / (k * len(counts))}
    for at in PASS_AT:
        if at <= k:
            metrics[f"pass@{at}"] = sum(pass_at_k(k, c, at) for c in counts) / len(counts)
    metrics["zero_success_rate"] = sum(c == 0 for c in counts) / len(counts)
    return metrics


def held_out_tasks(path: Path, count: int) -> list[Task]:
    """The first ``count`` valid tasks of ``path``: the same for every run that names the file."""
    held_out = [task for task in iter_jsonl(path, Task) if task.validity.valid][:count]
    if not held_out:
        raise NotEnoughData(f"no valid held-out tasks in {path}")
    return held_out


def split_held_out(path: Path, training: list[Task], count: int) -> tuple[list[Task], list[Task]]:
    """The first ``count`` valid tasks of ``path`` (the same for every run that names the file, so
    runs compare prompt by prompt), and the training tasks whose text is not among them."""
    held_out = held_out_tasks(path, count)
    texts = {json.dumps(task.text) for task in held_out}
    training = [task for task in training if json.dumps(task.text) not in texts]
    if not training:
        raise NotEnoughData("every training task is also a held-out task")
    return held_out, training


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` attempts of which ``c`` passed: the chance that k
    attempts drawn without replacement from the n include a pass, 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


#: two-sided 95% quantiles of Student's t for 1..30 degrees of freedom (beyond 30, 30's: a little wide)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)  # fmt: skip


def paired_comparison(
    ours: Sequence[float],
    baseline: Sequence[float],
    groups: Sequence[object] | None = None,
    resamples: int = 2000,
    seed: int = 0,
) -> dict:
    """Paired comparison of two arms' scores on the same prompts: wins, losses, ties, the mean
    difference and its 95% bootstrap interval (``ci95``, seeded).

    Without ``groups`` the bootstrap resamples prompts with replacement. With ``groups`` (one label
    per pair, e.g. the RL seed that produced it) it is two-level: each resample draws as many groups
    as there are, with replacement, then within each drawn group as many of its pairs, with
    replacement, and takes the mean over all drawn pairs; so the interval also carries the spread
    between seeds, not only between prompts. With few groups that interval is too narrow (with 3
    seeds a resample repeats one seed thrice 1 time in 9, so its ends sit near the smallest and
    largest seed's shift), so two or more groups also give ``seed_t95``: the 95% t-interval of
    the mean over the groups' own mean differences (each of which already carries its prompts'
    noise), ``group_means`` and ``groups``.
    """
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"need two equally long, non-empty score lists, got {len(ours)} and {len(baseline)}")
    differences = [a - b for a, b in zip(ours, baseline, strict=True)]
    if groups is not None and len(groups) != len(differences):
        raise ValueError(f"need one group per pair, got {len(groups)} groups for {len(differences)} pairs")
    by_group: dict[object, list[float]] = {}
    for group, difference in zip(groups if groups is not None else [None] * len(differences), differences, strict=True):
        by_group.setdefault(group, []).append(difference)
    clusters = list(by_group.values())
    rng = random.Random(seed)

    def resample() -> float:
        drawn = rng.choices(clusters, k=len(clusters)) if len(clusters) > 1 else clusters
        return statistics.fmean(d for cluster in drawn for d in rng.choices(cluster, k=len(cluster)))

    means = sorted(resample() for _ in range(resamples))
    result = {
        "wins": sum(d > 0 for d in differences),
        "losses": sum(d < 0 for d in differences),
        "ties": sum(d == 0 for d in differences),
        "groups": len(clusters),
        "mean_difference": statistics.fmean(differences),
        "ci95": (means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]),
    }
    if len(clusters) > 1:
        group_means = [statistics.fmean(cluster) for cluster in clusters]
        center = statistics.fmean(group_means)
        half = T_975[min(len(clusters) - 1, len(T_975)) - 1] * statistics.stdev(group_means) / math.sqrt(len(clusters))
        result |= {"group_means": group_means, "seed_t95": (center - half, center + half)}
    return result


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


def rounds_curve(folder: Path) -> list[dict]:
    """What ``propel rounds`` left in ``folder`` (``RUN/rounds``), a row per round: round 0 the base
    solver's held-out score, then each finished round's (``round.json``): its held-out score and 95%
    interval, the paired difference with the base solver, the in-band rates of its labeled sample for
    the trained solver and the one before (and the utility they give: times the share of the round's
    generations that were valid), the stale probe's AUC on those labels, the generator's last
    probe reward, the solver attempts spent so far (the corpus's labels not included) and its seconds."""
    base = folder / "r0" / "held_out.json"
    if not base.exists():
        return []
    found = json.loads(base.read_text())
    spent = found["k"] * len(found["counts"])
    rows = [{"round": 0, "score": found["metrics"]["average_score"], "ci95": found["ci95"], "attempts": spent}]
    number = 1
    while (summary := folder / f"r{number}" / "round.json").exists():
        found = json.loads(summary.read_text())
        spent += found["solver_attempts"]["total"]
        times = folder / f"r{number}" / "times.json"
        held_out, rates, tasks = found["held_out"], found["in_band"], found["tasks"]
        valid = tasks["valid"] / tasks["generated"] if tasks.get("generated") else None
        trained, previous = ((rates[key] or {}).get("in_band") for key in ("trained_solver", "previous_solver"))
        rows.append(
            {
                "round": number,
                "score": held_out["metrics"]["average_score"],
                "ci95": held_out["ci95"],
                "vs_base": held_out["vs_base"]["mean_difference"],
                "vs_base_ci95": held_out["vs_base"]["ci95"],
                "in_band_trained": trained,
                "in_band_previous": previous,
                "utility_trained": None if trained is None or valid is None else trained * valid,
                "utility_previous": None if previous is None or valid is None else previous * valid,
                "labeled": (rates["trained_solver"] or {}).get("labels"),
                "probe_auc": found["probe_auc_on_round_labels"],
                "generator_reward": found["generator_reward"],
                "solver_tasks": len(found["tasks"]["ids"]),
                "attempts": spent,
                "seconds": round(sum(json.loads(times.read_text()).values())) if times.exists() else None,
            }
        )
        number += 1
    return rows
