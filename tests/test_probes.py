"""Probe heads: shapes and the appendix-14 MLP layout."""

import pytest
import torch


@pytest.mark.parametrize("name", ["linear", "mlp", "deep_mlp"])
def test_logit_per_row(propel_registry, name):
    head = propel_registry.get("probe_architectures", name)(576)
    assert head(torch.randn(64, 576)).shape == (64,)


def test_mlp_layout(propel_registry):
    head = propel_registry.get("probe_architectures", "mlp")(576)
    widths = [(m.in_features, m.out_features) for m in head if isinstance(m, torch.nn.Linear)]
    assert widths == [(576, 512), (512, 128), (128, 1)]
    assert {m.p for m in head if isinstance(m, torch.nn.Dropout)} == {0.3}


def test_mlp_learns_xor(propel_registry):
    """A head that cannot fit a simple non-linear rule would be useless as a probe."""
    torch.manual_seed(0)
    x = torch.randint(0, 2, (256, 2)).float()
    y = (x[:, 0] != x[:, 1]).float()
    head = propel_registry.get("probe_architectures", "mlp")(2)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-2)
    for _ in range(200):
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(head(x), y).backward()
        optimizer.step()
    head.eval()
    assert ((head(x) > 0).float() == y).float().mean() == 1.0


def test_calibration_bins_match_scikit_learns_calibration_curve():
    """The bins behind ECE and the reliability diagram are scikit-learn's uniform ones: the same mean
    probability and in-band rate per non-empty bin."""
    import numpy as np
    import torch
    from sklearn.calibration import calibration_curve

    from propel_core.probes.metrics import calibration_bins, ece

    generator = torch.Generator().manual_seed(0)
    probabilities = torch.rand(500, generator=generator) ** 2  # uneven: some bins nearly empty
    y = (torch.rand(500, generator=generator) < probabilities).long()
    found = calibration_bins(y, probabilities, 10)
    rate, mean = calibration_curve(y.numpy(), probabilities.numpy(), n_bins=10, strategy="uniform")
    assert np.allclose([b[1] for b in found], rate) and np.allclose([b[0] for b in found], mean, atol=1e-6)
    assert sum(b[2] for b in found) == 500
    expected = sum(n / 500 * abs(m - r) for (m, r, n) in found)
    assert ece(y, probabilities) == expected and 0 < expected < 0.2
