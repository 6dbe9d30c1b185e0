"""Every pooler on hand-made hidden states, padded on either side, against a plain loop."""

import pytest
import torch

LENGTHS = [5, 1, 3, 8]
T, D = 8, 4


def batch(side: str):
    torch.manual_seed(0)
    hidden = torch.randn(len(LENGTHS), T, D)
    mask = torch.zeros(len(LENGTHS), T, dtype=torch.long)
    for row, length in enumerate(LENGTHS):
        if side == "right":
            mask[row, :length] = 1
        else:
            mask[row, T - length :] = 1
    hidden[mask == 0] = 1e6  # padding must never reach a pooled vector
    return hidden, mask


def real_tokens(hidden, mask, row):
    return hidden[row][mask[row].bool()]  # [length, D], in order


def reference(name: str, tokens: torch.Tensor) -> torch.Tensor:
    n = len(tokens)
    if name == "last_token":
        return tokens[-1]
    if name == "mean_full":
        return tokens.mean(0)
    if name.startswith("mean_last_") and name != "mean_last_half":
        return tokens[-int(name.rsplit("_", 1)[1]) :].mean(0)
    if name == "mean_last_half":
        return tokens[n - (n + 1) // 2 :].mean(0)
    if name == "max":
        return tokens.max(0).values
    if name == "first_last_concat":
        return torch.cat([tokens[0], tokens[-1]])
    if name == "mean_std_concat":
        return torch.cat([tokens.mean(0), tokens.std(0, unbiased=False)])
    raise AssertionError(name)


POOLERS = [
    "last_token",
    "mean_full",
    "mean_last_50",
    "mean_last_5",
    "mean_last_3",
    "mean_last_half",
    "max",
    "first_last_concat",
    "mean_std_concat",
]


def test_all_builtin_poolers_covered(propel_registry):
    assert sorted(POOLERS) == propel_registry.names("poolers")


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("name", POOLERS)
def test_pooler_matches_reference(propel_registry, name, side):
    hidden, mask = batch(side)
    pooled = propel_registry.get("poolers", name)(hidden, mask)
    assert pooled.shape[0] == len(LENGTHS)
    for row in range(len(LENGTHS)):
        expected = reference(name, real_tokens(hidden, mask, row))
        torch.testing.assert_close(pooled[row], expected)
