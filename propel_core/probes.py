"""Probe training, metrics, and the probe bundle that scores raw texts end to end (appendix 14)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from propel_core.config import ModelConfig, ProbeConfig
from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.errors import PropelError
from propel_core.records import ProbeBundle


@dataclass
class TrainedProbe:
    """A head plus the feature standardization it was trained with."""

    head: Any  # torch.nn.Module
    mean: Any  # Tensor[dim]
    std: Any  # Tensor[dim]
    epochs: int

    def logits(self, x):
        import torch

        self.head.eval()
        with torch.no_grad():  # not inference_mode: calibration fits a temperature on these logits
            return self.head((x - self.mean) / self.std)


def train_probe(factory, x, y, train, val, config: ProbeConfig, weighted: bool, seed: int) -> TrainedProbe:
    """AdamW, batches of ``config.batch_size``, up to ``config.epochs`` epochs, early stopping after
    ``config.patience`` epochs without a better validation balanced accuracy (ties: lower loss)."""
    import torch

    torch.manual_seed(seed)
    mean, std = x[train].mean(0), x[train].std(0).clamp(min=1e-6)
    features = (x - mean) / std
    labels = y.float()
    head = factory(x.shape[1])
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    positives = labels[train].sum()
    pos_weight = (len(train) - positives) / positives.clamp(min=1) if weighted else torch.tensor(1.0)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    generator = torch.Generator().manual_seed(seed)
    best, best_state, best_epoch, waited = (-1.0, math.inf), None, 0, 0
    for epoch in range(1, config.epochs + 1):
        head.train()
        for batch in train[torch.randperm(len(train), generator=generator)].split(config.batch_size):
            optimizer.zero_grad()
            loss_fn(head(features[batch]), labels[batch]).backward()
            optimizer.step()
        head.eval()
        with torch.inference_mode():
            val_logits = head(features[val])
            score = (balanced_accuracy(y[val], val_logits > 0), -loss_fn(val_logits, labels[val]).item())
        if score > best:
            best, best_epoch, waited = score, epoch, 0
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
        else:
            waited += 1
            if waited >= config.patience:
                break
    head.load_state_dict(best_state)
    return TrainedProbe(head, mean, std, best_epoch)


# -- metrics ----------------------------------------------------------------------------------------


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


def ece(y, probabilities, bins: int = 10) -> float:
    """Expected calibration error over equal-width probability bins."""
    total, error = len(y), 0.0
    edges = [i / bins for i in range(bins + 1)]
    for low, high in itertools.pairwise(edges):
        inside = (probabilities >= low) & ((probabilities < high) if high < 1 else (probabilities <= high))
        if inside.any():
            error += (
                inside.sum().item() / total * abs(probabilities[inside].mean().item() - y[inside].float().mean().item())
            )
    return error


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


TEMPERATURE_RANGE = (0.1, 10.0)


def fit_temperature(logits, y) -> float:
    """The temperature T minimizing validation NLL of sigmoid(logit / T), kept in TEMPERATURE_RANGE:
    on a small, perfectly separated validation split the optimum runs off towards 0, which would only
    make an overfit probe more confident."""
    import torch

    log_t = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=100)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(logits / log_t.exp(), y.float())
        loss.backward()
        return loss

    optimizer.step(closure)
    low, high = TEMPERATURE_RANGE
    return min(max(float(log_t.exp()), low), high)


# -- the bundle -------------------------------------------------------------------------------------


def save_bundle(folder: Path, probe: TrainedProbe, description: ProbeBundle) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"head.{k}": v.contiguous() for k, v in probe.head.state_dict().items()}
    save_file({**tensors, "mean": probe.mean.contiguous(), "std": probe.std.contiguous()}, folder / "probe.safetensors")
    (folder / "probe.json").write_text(description.model_dump_json(indent=2) + "\n")


class ProbeScorer:
    """A saved probe, ready to score raw task texts: tokenize, truncated forward pass, pool, head."""

    def __init__(self, folder: str | Path, registry=None):
        from safetensors.torch import load_file

        from propel_core.plugins import Registry

        folder = Path(folder)
        if not (folder / "probe.json").exists():
            raise PropelError(f"no probe bundle in {folder} (probe.json is missing)")
        self.bundle = ProbeBundle.model_validate_json((folder / "probe.json").read_text())
        self.registry = registry or Registry.build()
        tensors = load_file(folder / "probe.safetensors")
        head = self.registry.get("probe_architectures", self.bundle.architecture)(self.bundle.input_dim)
        head.load_state_dict({k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")})
        self.probe = TrainedProbe(head, tensors["mean"], tensors["std"], epochs=0)
        self.poolers = {self.bundle.pooling: self.registry.get("poolers", self.bundle.pooling)}
        self.turn_vector = self.registry.get("poolers", self.bundle.turn_vector)
        model = None if self.bundle.reference_model == EMBEDDED_MODEL_ID else self.bundle.reference_model
        self.backend = self.registry.backend(ModelConfig(model=model))

    def logits_of_features(self, x):
        return self.probe.logits(x) / self.bundle.temperature

    def features(self, texts: list[str | list[str]], batch_size: int = 8):
        """The pooled reference activations the head reads, exactly as the extract stage pools them."""
        from propel_core.stages.extract import pooled_activations

        layer, pooling = self.bundle.layer, self.bundle.pooling
        return pooled_activations(
            self.backend, texts, [layer], self.poolers, self.turn_vector, self.bundle.max_length, batch_size
        )[layer, pooling]

    def score(self, texts: list[str | list[str]], batch_size: int = 8) -> list[dict[str, float]]:
        """``logit`` and ``probability`` of the in-band class for each text or trajectory (a list of
        turns), with the temperature applied."""
        import torch

        logits = self.logits_of_features(self.features(texts, batch_size))
        return [{"logit": float(logit), "probability": float(torch.sigmoid(logit))} for logit in logits]


def load_probe(folder: str | Path, registry=None) -> ProbeScorer:
    """Load a probe bundle (``probe.json`` + ``probe.safetensors``) for scoring raw texts."""
    return ProbeScorer(folder, registry)
