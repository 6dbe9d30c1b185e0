"""The Bradley-Terry reward model: metrics by hand, a planted ordering learned, shuffled pairs not."""

import math
import random

import pytest
import torch

from propel_core.training.ranking import (
    fit_calibration,
    held_out_split,
    kendall_tau_b,
    ordered_pairs,
    ranking_metrics,
    top_overlap,
    train_bradley_terry,
)


def test_kendall_tau_b_by_hand():
    assert kendall_tau_b([1, 2, 3], [1, 2, 3]) == 1.0
    assert kendall_tau_b([1, 2, 3], [3, 2, 1]) == -1.0
    # a = 1,2,3,4 and b = 1,1,2,3: 5 concordant, 0 discordant, 1 tie in b -> 5 / sqrt(6 * 5)
    assert kendall_tau_b([1, 2, 3, 4], [1, 1, 2, 3]) == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(kendall_tau_b([1, 1], [1, 2]))


def test_top_overlap_and_pairs():
    model = torch.tensor([9.0, 8.0, 1.0, 0.0] + [0.5] * 16)
    verifier = torch.tensor([1.0, 0.0, 2.0, 3.0] + [-1.0] * 16)
    assert top_overlap(model, verifier) == 0.0  # top 2 by the model: rows 0, 1; by the verifier: 3, 2
    assert top_overlap(verifier, verifier) == 1.0
    assert ordered_pairs([0, 1, 2], [0.5, 0.5, 1.0], 10, 0) == [(2, 0), (2, 1)]  # ties give no pair
    assert len(ordered_pairs(list(range(10)), list(range(10)), 7, 0)) == 7


def test_attempts_pair_within_their_task_and_whole_tasks_are_held_out():
    groups = ["a", "a", "b", "b", "b"]
    scores = [0.1, 0.9, 5.0, 3.0, 4.0]
    assert ordered_pairs(range(5), scores, 10, 0, groups) == [(1, 0), (2, 3), (2, 4), (4, 3)]
    assert len(ordered_pairs(range(5), scores, 10, 0)) == 10  # without groups every two rows pair
    tasks = [f"t{i // 3}" for i in range(30)]  # 10 tasks of 3 attempts
    held_out, train = held_out_split(tasks, 0.2, 0, least=1)
    assert sorted(held_out + train) == list(range(30)) and len(held_out) == 6
    assert not {tasks[i] for i in held_out} & {tasks[i] for i in train}
    # rows as their own units: the split the task ranker always made (a seeded shuffle, the first held out)
    rows, _ = held_out_split(list(range(10)), 0.2, 3, least=2)
    order = list(range(10))
    random.Random(3).shuffle(order)
    assert rows == sorted(order[:2])


def test_calibration_is_the_least_squares_line_within_the_scores_range():
    logits = torch.tensor([-2.0, 0.0, 1.0, 3.0])
    line = fit_calibration(logits, 0.5 * logits + 0.25)
    assert line == pytest.approx({"slope": 0.5, "intercept": 0.25, "low": -0.75, "high": 1.75})
    flat = fit_calibration(torch.zeros(3), torch.tensor([0.2, 0.4, 0.9]))
    assert flat == pytest.approx({"slope": 0.0, "intercept": 0.5, "low": 0.2, "high": 0.9})


def planted(n=240, dim=16, seed=0):
    """Features whose first coordinate (plus a little noise) is the verifier score."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=generator)
    scores = x[:, 0] + 0.1 * torch.randn(n, generator=generator)
    return x, scores


def fit(x, pairs, seed=0):
    linear = lambda dim: torch.nn.Sequential(torch.nn.Linear(dim, 1), torch.nn.Flatten(0))  # noqa: E731
    return train_bradley_terry(linear, x, pairs, lr=1e-2, weight_decay=0.0, epochs=30, batch_size=64, seed=seed)


def test_learns_a_planted_ordering_and_fails_on_shuffled_pairs():
    x, scores = planted()
    train, test = list(range(180)), list(range(180, 240))
    pairs = ordered_pairs(train, scores.tolist(), 4000, 0)
    held_out = [(i - 180, j - 180) for i, j in ordered_pairs(test, scores.tolist(), 4000, 0)]
    learned = ranking_metrics(fit(x, pairs).logits(x)[test], scores[test], held_out)
    assert learned["pair_accuracy"] > 0.9 and learned["spearman"] > 0.9 and learned["kendall_tau_b"] > 0.75
    # the control: pairs ordered by shuffled scores carry no signal. One fit on noise lands anywhere in
    # roughly 0.3-0.7, so the mean over four shuffles is what must sit at chance
    chance = []
    for seed in range(4):
        shuffled = scores[torch.randperm(len(scores), generator=torch.Generator().manual_seed(seed))]
        noise = ordered_pairs(train, shuffled.tolist(), 4000, 0)
        chance.append(ranking_metrics(fit(x, noise).logits(x)[test], scores[test], held_out)["pair_accuracy"])
    assert abs(sum(chance) / 4 - 0.5) < 0.1


def test_refresh_continues_from_the_saved_head():
    x, scores = planted()
    pairs = ordered_pairs(list(range(120)), scores.tolist(), 2000, 0)
    first = fit(x, pairs)
    weight = first.head[0].weight.detach().clone()
    linear = lambda dim: pytest.fail("a refresh must not build a new head")  # noqa: E731
    refreshed = train_bradley_terry(
        linear, x, pairs[:50], lr=1e-2, weight_decay=0.0, epochs=1, batch_size=64, seed=0, start=first
    )
    assert refreshed.head is first.head and torch.equal(refreshed.mean, first.mean)
    assert not torch.equal(refreshed.head[0].weight, weight)
