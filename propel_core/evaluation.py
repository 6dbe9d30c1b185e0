"""Metrics of a generator arm (paper section 4.1): utility, validity, diversity, solve counts.

Every metric comes with a standard error. Texts are split on whitespace for the n-gram metrics.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence

from propel_core.records import Label, Task


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
    solved = Counter(sum(bool(a.solved) for a in label.attempts) for label in labels)
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
        "solve_count_shares": [share(solved.get(count, 0), len(labels)) for count in range(k + 1)],
    }
    return metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from ``n`` attempts of which ``c`` passed: the chance that k
    attempts drawn without replacement from the n include a pass, 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def paired_comparison(ours: Sequence[float], baseline: Sequence[float], resamples: int = 2000, seed: int = 0) -> dict:
    """Per-prompt paired comparison: wins, losses, ties, the mean difference and its 95% paired
    bootstrap interval (prompts resampled with replacement, seeded)."""
    if len(ours) != len(baseline) or not ours:
        raise ValueError(f"need two equally long, non-empty score lists, got {len(ours)} and {len(baseline)}")
    differences = [a - b for a, b in zip(ours, baseline, strict=True)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(differences, k=len(differences))) for _ in range(resamples))
    return {
        "wins": sum(d > 0 for d in differences),
        "losses": sum(d < 0 for d in differences),
        "ties": sum(d == 0 for d in differences),
        "mean_difference": statistics.fmean(differences),
        "ci95": (means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]),
    }
