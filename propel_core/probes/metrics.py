"""How well a probe separates in-band tasks: balanced accuracy, F1, AUC, calibration error (ECE and its
bins), Spearman against solve rates."""

from __future__ import annotations

import logging
import math

log = logging.getLogger("propel")


def balanced_accuracy(y, predicted) -> float:
    """Mean of the recall of each class present; 0.5 is chance."""
    y, predicted = y.bool(), predicted.bool()
    recalls = [(predicted[y == cls] == cls).float().mean().item() for cls in (True, False) if (y == cls).any()]
    return sum(recalls) / len(recalls)


def f1(y, predicted) -> float:
    y, predicted = y.bool(), predicted.bool()
    tp = (y & predicted).sum().item()
    denominator = 2 * tp + (~y & predicted).sum().item() + (y & ~predicted).sum().item()
    return 2 * tp / denominator if denominator else 0.0


def auc(y, scores) -> float:
    """Area under the ROC curve: the chance that a random positive outranks a random negative."""
    y = y.bool()
    positives, negatives = scores[y], scores[~y]
    if len(positives) == 0 or len(negatives) == 0:
        return math.nan
    greater = (positives[:, None] > negatives[None, :]).float().mean()
    ties = (positives[:, None] == negatives[None, :]).float().mean()
    return (greater + ties / 2).item()


def calibration_bins(y, probabilities, bins: int = 10) -> list[tuple[float, float, int]]:
    """Equal-width probability bins (the last one closed): for each bin holding rows, their mean
    probability, their in-band rate and how many they are."""
    found = []
    for b in range(bins):
        low, high = b / bins, (b + 1) / bins
        inside = (probabilities >= low) & ((probabilities < high) if b < bins - 1 else (probabilities <= high))
        if inside.any():
            found.append((probabilities[inside].mean().item(), y[inside].float().mean().item(), int(inside.sum())))
    return found


def ece(y, probabilities, bins: int = 10) -> float:
    """Expected calibration error over equal-width probability bins."""
    return sum(count / len(y) * abs(mean - rate) for mean, rate, count in calibration_bins(y, probabilities, bins))


def spearman(a, b) -> float:
    """Spearman rank correlation, with average ranks for ties."""
    import torch

    ra, rb = _ranks(a), _ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def _ranks(values):
    import torch

    values = values.double()
    order = values.argsort()
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(len(values), dtype=torch.double)
    for value in values.unique():  # average ranks over ties
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def metrics(y, logits, solve_rates) -> dict[str, float]:
    import torch

    probabilities = torch.sigmoid(logits)
    return {
        "balanced_accuracy": balanced_accuracy(y, logits > 0),
        "ece": ece(y, probabilities),
        "auc": auc(y, logits),
        "f1": f1(y, logits > 0),
        "spearman": spearman(probabilities, solve_rates),
    }
