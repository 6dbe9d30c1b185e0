"""A Bradley-Terry reward model: the second kind of amortized scorer beside the probe (seed 002).

A head on frozen reference features gives each task a scalar score s; it is trained on pairs (i, j)
whose verifier scores order i above j, with the loss -log sigmoid(s_i - s_j). It is saved in the
probe bundle format, so anything that loads a probe (the reward scorer, ``reward.main_probe``) can
use it, its score in place of the probe logit.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from propel_core.probes import TrainedProbe, spearman


def ordered_pairs(rows: Sequence[int], scores: Sequence[float], max_pairs: int, seed: int) -> list[tuple[int, int]]:
    """Pairs (i, j) of ``rows`` with scores[i] > scores[j] (ties give no pair), at most ``max_pairs``
    of them, drawn at random (seeded) when there are more."""
    pairs = [
        (i, j) if scores[i] > scores[j] else (j, i)
        for a, i in enumerate(rows)
        for j in rows[a + 1 :]
        if scores[i] != scores[j]
    ]
    if len(pairs) > max_pairs:
        pairs = random.Random(seed).sample(pairs, max_pairs)
    return pairs


def train_bradley_terry(
    factory,
    x,
    pairs,
    *,
    lr: float,
    weight_decay: float,
    epochs: int,
    batch_size: int,
    seed: int,
    start: TrainedProbe | None = None,
) -> TrainedProbe:
    """Fit a head (new, or continuing ``start``: the on-policy refresh) on ordered pairs of rows of x."""
    import torch

    torch.manual_seed(seed)
    if start is None:
        rows = sorted({i for pair in pairs for i in pair})
        mean, std = x[rows].mean(0), x[rows].std(0).clamp(min=1e-6)
        head = factory(x.shape[1])
    else:
        mean, std, head = start.mean, start.std, start.head
    features = (x - mean) / std
    winners = torch.tensor([i for i, _ in pairs])
    losers = torch.tensor([j for _, j in pairs])
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    head.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(pairs), generator=generator).split(batch_size):
            optimizer.zero_grad()
            margin = head(features[winners[batch]]) - head(features[losers[batch]])
            torch.nn.functional.softplus(-margin).mean().backward()  # = -log sigmoid(margin)
            optimizer.step()
    head.eval()
    return TrainedProbe(head, mean, std, epochs)


def kendall_tau_b(a, b) -> float:
    """Kendall's tau-b: (concordant - discordant) / sqrt((n0 - ties in a) (n0 - ties in b))."""
    n = len(a)
    concordant = discordant = ties_a = ties_b = 0
    for i in range(n):
        for j in range(i + 1, n):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0:
                ties_a += 1
            if db == 0:
                ties_b += 1
            if da * db > 0:
                concordant += 1
            elif da * db < 0:
                discordant += 1
    pairs = n * (n - 1) / 2
    denominator = math.sqrt((pairs - ties_a) * (pairs - ties_b))
    return (concordant - discordant) / denominator if denominator else math.nan


def top_overlap(model_scores, verifier_scores, share: float = 0.1) -> float:
    """The share of the top ``share`` of tasks by verifier score that are also in the model's top."""
    k = max(1, math.ceil(share * len(model_scores)))
    top_model = set((-model_scores).argsort(stable=True)[:k].tolist())
    top_verifier = set((-verifier_scores).argsort(stable=True)[:k].tolist())
    return len(top_model & top_verifier) / k


def ranking_metrics(model_scores, verifier_scores, pairs: list[tuple[int, int]]) -> dict[str, float]:
    """Pair accuracy on ``pairs`` (indices into the score tensors), and over all the tasks Spearman,
    Kendall tau-b and top-10% overlap between model and verifier scores."""
    correct = sum(float(model_scores[i]) > float(model_scores[j]) for i, j in pairs)
    return {
        "pair_accuracy": correct / len(pairs) if pairs else math.nan,
        "spearman": spearman(model_scores, verifier_scores),
        "kendall_tau_b": kendall_tau_b(model_scores.tolist(), verifier_scores.tolist()),
        "top10_overlap": top_overlap(model_scores, verifier_scores),
    }
