"""Probe heads: a pooled vector ``[B, d]`` -> one logit per task for the in-band class.

The paper's heads end in two classes; one logit is the same model (the difference of the two class
logits) with half the output weights. ``logistic`` is a linear head fitted by scikit-learn's
``LogisticRegression`` (an optional dependency: the ``sklearn`` extra) instead of AdamW; scoring a saved
``logistic`` probe needs only torch.
"""

from __future__ import annotations

from propel_core import PropelError, hookimpl


@hookimpl
def register_probe_architectures(register):
    register("linear", linear)
    register("mlp", mlp)
    register("deep_mlp", deep_mlp)
    register("logistic", logistic)


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


def logistic(input_dim: int):
    """d -> logit, the weights of an L2-regularized (C=1) logistic regression fitted by scikit-learn."""
    return _head(input_dim, (), 0.0)


def _fit_logistic(head, features, y, train, pos_weight: float) -> int:
    """Fit ``head`` (a ``linear`` layout) on the standardized training rows, a positive weighing
    ``pos_weight`` as in the gradient-trained heads' loss. Returns lbfgs's iterations (the sweep's
    ``epochs`` column for this architecture)."""
    import torch

    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise PropelError(
            "the 'logistic' probe architecture needs scikit-learn: pip install 'propel-core[sklearn]'"
        ) from None
    labels = y[train].long().numpy()
    if len(set(labels.tolist())) < 2:
        raise PropelError("the 'logistic' probe needs training rows of both classes; label more tasks")
    model = LogisticRegression(C=1.0, max_iter=1000, class_weight={0: 1.0, 1: pos_weight})
    model.fit(features[train].double().numpy(), labels)
    linear = head[0]
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(model.coef_))
        linear.bias.copy_(torch.from_numpy(model.intercept_))
    return int(model.n_iter_.max())


logistic.fit = _fit_logistic  # train_probe(s) call it instead of the AdamW loop
