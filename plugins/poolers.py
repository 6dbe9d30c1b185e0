"""Poolers: one task's hidden states ``[B, T, D]`` and mask ``[B, T]`` -> one vector per task.

The mask marks real tokens; padding may sit on either side and never reaches the result. Every
pooler works from two per-token quantities derived from the mask: whether a token is real, and how
many real tokens sit at or after it (its rank from the end).
"""

from __future__ import annotations

from propel_core import hookimpl


@hookimpl
def register_poolers(register):
    register("last_token", last_token)
    register("mean_full", mean_full)
    for n in (50, 5, 3):
        register(f"mean_last_{n}", mean_last(n))
    register("mean_last_half", mean_last_half)
    register("max", max_pool)
    register("first_last_concat", first_last_concat)
    register("mean_std_concat", mean_std_concat)


def _masked_mean(hidden, keep):
    keep = keep.to(hidden.dtype).unsqueeze(-1)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)


def _rank_from_end(mask):
    """For each real token, how many real tokens are at or after it (1 = the last real token)."""
    return mask.flip(1).cumsum(1).flip(1) * mask


def _pick(hidden, keep):
    return hidden[keep.bool()].view(hidden.shape[0], hidden.shape[-1])


def last_token(hidden, mask):
    return _pick(hidden, _rank_from_end(mask) == 1)


def first_token(hidden, mask):
    lengths = mask.sum(1, keepdim=True)
    return _pick(hidden, _rank_from_end(mask) == lengths)


def mean_full(hidden, mask):
    return _masked_mean(hidden, mask)


def mean_last(n: int):
    """The mean over the last ``n`` real tokens (all of them when a task is shorter)."""

    def pool(hidden, mask):
        rank = _rank_from_end(mask)
        return _masked_mean(hidden, (rank >= 1) & (rank <= n))

    pool.__name__ = f"mean_last_{n}"
    return pool


def mean_last_half(hidden, mask):
    """The mean over the last ceil(length / 2) real tokens of each task."""
    rank = _rank_from_end(mask)
    half = (mask.sum(1, keepdim=True) + 1) // 2
    return _masked_mean(hidden, (rank >= 1) & (rank <= half))


def max_pool(hidden, mask):
    return hidden.masked_fill(~mask.bool().unsqueeze(-1), float("-inf")).amax(1)


def first_last_concat(hidden, mask):
    import torch

    return torch.cat([first_token(hidden, mask), last_token(hidden, mask)], dim=-1)


def mean_std_concat(hidden, mask):
    import torch

    mean = _masked_mean(hidden, mask)
    variance = _masked_mean((hidden - mean.unsqueeze(1)) ** 2, mask)
    return torch.cat([mean, variance.sqrt()], dim=-1)
