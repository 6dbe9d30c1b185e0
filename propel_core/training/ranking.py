"""A Bradley-Terry reward model: the second kind of amortized scorer beside the probe (the ML-engineering RL study).

A head on reference features gives each item (a task, or a solver attempt at one) a scalar score s;
it is trained on pairs (i, j) whose verifier scores order i above j, with the loss
-log sigmoid(s_i - s_j), on frozen features or jointly with a LoRA on the reference. It is saved in
the probe bundle format, so anything that loads a probe (the reward scorer, ``reward.main_probe``)
can use it, its score in place of the probe logit, with a calibration to the verifier's scale.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from propel_core.probes.heads import TrainedProbe
from propel_core.probes.metrics import spearman
from propel_core.training.trainer import SortedSet


def ordered_pairs(
    rows: Sequence[int], scores: Sequence[float], max_pairs: int, seed: int, groups: Sequence | None = None
) -> list[tuple[int, int]]:
    """Pairs (i, j) of ``rows`` with scores[i] > scores[j] (ties give no pair), at most ``max_pairs``
    of them, drawn at random (seeded) when there are more. With ``groups``, only rows of one group
    pair: the attempts at one task, whose scores are on one metric."""
    pairs = [
        (i, j) if scores[i] > scores[j] else (j, i)
        for a, i in enumerate(rows)
        for j in rows[a + 1 :]
        if scores[i] != scores[j] and (groups is None or groups[i] == groups[j])
    ]
    if len(pairs) > max_pairs:
        pairs = random.Random(seed).sample(pairs, max_pairs)
    return pairs


def held_out_split(units: Sequence, share: float, seed: int, least: int) -> tuple[list[int], list[int]]:
    """(held_out, train) rows: the distinct ``units`` (each row's task, or the row itself) shuffled
    (seeded), and the rows of the first max(least, round(share * units)) of them held out, so that no
    unit has rows on both sides."""
    distinct = list(dict.fromkeys(units))
    random.Random(seed).shuffle(distinct)
    chosen = set(distinct[: max(least, round(len(distinct) * share))])
    held_out = [row for row, unit in enumerate(units) if unit in chosen]
    return held_out, [row for row, unit in enumerate(units) if unit not in chosen]


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


def with_lora(model, adapter: str | None, config, seed: int):
    """``model`` (a Hugging Face causal LM, changed in place) with a trainable LoRA: the one saved at
    ``adapter``, or a new one of the peft ``config`` (seeded). Returns the peft model, whose
    ``save_pretrained`` writes the adapter, in eval mode (peft leaves the new layers' dropout on)."""
    import torch
    from peft import PeftModel, get_peft_model

    if adapter:
        loaded = PeftModel.from_pretrained(model, adapter, is_trainable=True).eval()
        saved = loaded.peft_config["default"]
        if isinstance(saved.target_modules, set):  # written back sorted, as lora_config's are
            saved.target_modules = SortedSet(saved.target_modules)
        return loaded
    torch.manual_seed(seed)
    return get_peft_model(model, config).eval()


def train_bradley_terry_lora(
    model, read, ranker: TrainedProbe, texts, pairs, *, lr: float, steps: int, batch_pairs: int, seed: int, advance=None
) -> list[float]:
    """Train the LoRA of ``model`` (a peft model) jointly with ``ranker``'s head on ordered pairs of
    ``texts``: each of ``steps`` AdamW steps draws ``batch_pairs`` pairs (seeded), reads their texts'
    features with ``read`` (the pooled forward of the model, which keeps its graph while the model
    trains), and follows the loss -log sigmoid(s_winner - s_loser). Returns each step's loss;
    ``advance(1)`` after each step."""
    import torch

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    trainable = [p for p in model.parameters() if p.requires_grad] + list(ranker.head.parameters())
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    losses = []
    model.train()
    ranker.head.train()
    try:
        for _ in range(steps):
            chosen = [pairs[k] for k in torch.randperm(len(pairs), generator=generator)[:batch_pairs].tolist()]
            rows = sorted({i for pair in chosen for i in pair})
            position = {row: k for k, row in enumerate(rows)}
            s = ranker.head((read([texts[i] for i in rows]) - ranker.mean) / ranker.std)
            margin = s[[position[i] for i, _ in chosen]] - s[[position[j] for _, j in chosen]]
            loss = torch.nn.functional.softplus(-margin).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if advance is not None:
                advance(1)
    finally:
        model.eval()
        ranker.head.eval()
    return losses


def fit_calibration(logits, scores) -> dict[str, float]:
    """The least-squares line from a ranker's logit to the verifier score (``slope``, ``intercept``),
    and the range of the scores it was fitted on (``low``, ``high``), which its values are clipped to:
    the ranker's score on the verifier's scale (``ProbeScorer.score``'s ``calibrated``)."""
    x, y = logits.double(), scores.double()
    dx = x - x.mean()
    variance = float((dx * dx).sum())
    slope = float((dx * (y - y.mean())).sum()) / variance if variance > 0 else 0.0
    intercept = float(y.mean()) - slope * float(x.mean())
    return {"slope": slope, "intercept": intercept, "low": float(y.min()), "high": float(y.max())}


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
