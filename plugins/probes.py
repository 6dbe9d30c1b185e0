"""Probe heads: a pooled vector ``[B, d]`` -> one logit per task for the in-band class.

The paper's heads end in two classes; one logit is the same model (the difference of the two class
logits) with half the output weights.
"""

from __future__ import annotations

from propel_core import hookimpl


@hookimpl
def register_probe_architectures(register):
    register("linear", linear)
    register("mlp", mlp)
    register("deep_mlp", deep_mlp)


def _head(input_dim: int, widths: tuple[int, ...], dropout: float):
    from torch import nn

    layers: list[nn.Module] = []
    for width in widths:
        layers += [nn.Linear(input_dim, width), nn.ReLU(), nn.Dropout(dropout)]
        input_dim = width
    layers += [nn.Linear(input_dim, 1), nn.Flatten(0)]
    return nn.Sequential(*layers)


def linear(input_dim: int):
    return _head(input_dim, (), 0.0)


def mlp(input_dim: int):
    """d -> 512 -> 128 -> logit, dropout 0.3 (appendix 14)."""
    return _head(input_dim, (512, 128), 0.3)


def deep_mlp(input_dim: int):
    """d -> 1024 -> 512 -> 256 -> 128 -> logit, dropout 0.3."""
    return _head(input_dim, (1024, 512, 256, 128), 0.3)
