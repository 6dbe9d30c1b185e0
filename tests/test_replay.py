"""The replay buffer: admission threshold (the one-character edge case) and each selection strategy."""

import pytest

from propel_core.training.replay import ReplayBuffer


def test_the_threshold_comparison_decides_exact_baseline_generations():
    strict = ReplayBuffer("round_robin", min_reward=0.5, comparison=">")
    inclusive = ReplayBuffer("round_robin", min_reward=0.5, comparison=">=")
    assert not strict.add("p", "baseline", 0.5, step=1)  # exactly at the threshold: kept out by ">"
    assert inclusive.add("p", "baseline", 0.5, step=1)  # and let in by ">="
    assert strict.add("p", "better", 0.500001, step=1) and not strict.add("p", "worse", 0.2, step=1)
    assert strict.select("p", 4) == ["better"] and inclusive.select("p", 4) == ["baseline"]


def test_round_robin_takes_turns():
    buffer = ReplayBuffer("round_robin", min_reward=0.0)
    for i, name in enumerate("abc"):
        buffer.add("p", name, 1.0, step=i)
    assert [buffer.select("p", 1)[0] for _ in range(4)] == ["a", "b", "c", "a"]
    assert buffer.select("p", 2) == ["b", "c"]


def test_top_k_prefers_the_best_and_capacity_drops_the_worst():
    buffer = ReplayBuffer("top_k", min_reward=0.0, capacity=3)
    for i, reward in enumerate([0.2, 0.9, 0.5, 0.7]):
        buffer.add("p", f"r{reward}", reward, step=i)
    assert buffer.select("p", 2) == ["r0.9", "r0.7"]
    assert sorted(e.reward for e in buffer.entries["p"]) == [0.5, 0.7, 0.9]  # 0.2 dropped at capacity


def test_previous_step_only_replays_the_latest_admitting_step():
    buffer = ReplayBuffer("previous_step", min_reward=0.0)
    buffer.add("p", "old", 1.0, step=1)
    buffer.add("p", "new-1", 0.6, step=3)
    buffer.add("p", "new-2", 0.7, step=3)
    assert buffer.select("p", 5) == ["new-1", "new-2"]
    assert buffer.select("unseen", 5) == []


def test_stable_uniform_is_seeded_and_without_repeats():
    def draws(seed):
        buffer = ReplayBuffer("stable_uniform", min_reward=0.0, seed=seed)
        for i in range(6):
            buffer.add("p", i, 1.0, step=i)
        return [buffer.select("p", 3) for _ in range(5)]

    assert draws(0) == draws(0)
    assert all(len(set(draw)) == 3 for draw in draws(0))
    assert {x for draw in draws(0) for x in draw} != {0, 1, 2}  # not always the first ones


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="unknown replay strategy 'latest'"):
        ReplayBuffer("latest", min_reward=0.5)
    with pytest.raises(ValueError, match="comparison must be"):
        ReplayBuffer("top_k", min_reward=0.5, comparison="=>")
