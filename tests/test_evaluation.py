"""Generator-arm metrics against values worked out by hand."""

import math

import pytest

from propel_core.evaluation import arm_metrics, distinct, self_bleu, share
from propel_core.records import Label, SolverAttempt, Task, Validity


def test_self_bleu_3_of_two_texts_by_hand():
    # "a b c d" vs "a b c e": unigrams 3/4, bigrams 2/3, trigrams 1/2 match; equal lengths, no penalty
    expected = (3 / 4 * 2 / 3 * 1 / 2) ** (1 / 3)
    value, se = self_bleu(["a b c d", "a b c e"])
    assert value == pytest.approx(expected) and se == pytest.approx(0.0)


def test_self_bleu_clips_counts_and_takes_the_best_other_text():
    # "x x x" against {"x y z", "x x q"}: unigram x is clipped to 2 (its count in "x x q"), bigram
    # "x x" to 1, trigram "x x x" appears nowhere -> BLEU-3 is 0 for that text
    texts = ["x x x", "x y z", "x x q"]
    value, _ = self_bleu(texts)
    # "x y z": unigram x only (1/3), no bigram match -> 0; "x x q": 1-grams x,x (2/3), bigram "x x"
    # (1/2), trigram none -> 0. Every text scores 0
    assert value == 0.0
    same, se = self_bleu(["p q r s", "p q r s", "p q r s"])
    assert same == pytest.approx(1.0) and se == 0.0


def test_self_bleu_brevity_penalty():
    # "a b c" against "a b c d": all precisions 1, but 3 < 4 -> exp(1 - 4/3); the longer text gets 3/4,
    # 2/3, 1/2 with no penalty
    short = math.exp(1 - 4 / 3)
    long = (3 / 4 * 2 / 3 * 1 / 2) ** (1 / 3)
    value, se = self_bleu(["a b c", "a b c d"])
    assert value == pytest.approx((short + long) / 2)
    assert se == pytest.approx(abs(short - long) / 2)  # sample std / sqrt(2) of two values


def test_self_bleu_needs_two_texts():
    with pytest.raises(ValueError, match="at least two"):
        self_bleu(["only one"])


def test_distinct_3_by_hand():
    # trigrams: (a b c) (b c d) | (a b c) (b c e) -> 3 unique of 4
    value, se = distinct(["a b c d", "a b c e"])
    assert value == pytest.approx(3 / 4) and se > 0
    assert distinct(["a b c", "a b c"])[0] == pytest.approx(1 / 2)
    assert distinct(["a b c d", "a b c e"]) == distinct(["a b c d", "a b c e"])  # seeded bootstrap


def test_share_is_binomial():
    assert share(1, 4) == pytest.approx((0.25, math.sqrt(0.25 * 0.75 / 4)))
    assert share(0, 0) == (0.0, 0.0)


def task(i, valid, text=None, topic=None):
    validity = Validity.ok() if valid else Validity.reject("no")
    return Task(
        id=f"t{i}",
        domain="d",
        context_id="c",
        generation="",
        generator="g",
        payload={} if valid else None,
        text=text,
        topic=topic,
        validity=validity,
    )


def test_arm_metrics_use_all_generations_as_the_utility_denominator():
    tasks = [
        task(0, True, "a b c d", "x"),
        task(1, True, "a b c e", "x"),
        task(2, True, "q r s t", "y"),
        task(3, False),
        task(4, False),
    ]
    labels = [
        Label.from_attempts(
            "t0", [SolverAttempt(text="", solved=s) for s in (True, False, False, False)], (0.25, 0.5), 1
        ),
        Label.from_attempts("t1", [SolverAttempt(text="", solved=False)] * 4, (0.25, 0.5), 1),
        Label.from_attempts("t2", [SolverAttempt(text="", solved=True)] * 4, (0.25, 0.5), 1),
    ]
    metrics = arm_metrics(tasks, labels, k=4)
    assert metrics["utility"] == pytest.approx(share(1, 5))  # one in band out of five generations
    assert metrics["valid_rate"] == pytest.approx(share(3, 5))
    assert metrics["top_topic"] == "x" and metrics["top_topic_share"] == pytest.approx(share(2, 3))
    assert metrics["solve_counts"] == [1, 1, 0, 0, 1]
    assert metrics["self_bleu_3"] == pytest.approx(self_bleu(["a b c d", "a b c e", "q r s t"]))
    assert arm_metrics(tasks[3:], [], k=4)["self_bleu_3"] is None  # nothing valid to measure


def test_a_trajectory_counts_as_its_turns_joined():
    trajectories = [task(0, True, ["a b", "c d"]), task(1, True, ["a b c", "e"])]
    metrics = arm_metrics(trajectories, [], k=4)
    assert metrics["self_bleu_3"] == pytest.approx(self_bleu(["a b\nc d", "a b c\ne"]))
    assert metrics["distinct_3"] == pytest.approx(distinct(["a b\nc d", "a b c\ne"]))


@pytest.mark.parametrize(
    ("n", "c", "k"), [(4, 1, 1), (4, 1, 2), (5, 2, 3), (16, 3, 8), (8, 0, 4), (8, 8, 1), (3, 2, 2)]
)
def test_pass_at_k_matches_the_closed_form(n, c, k):
    from math import comb

    from propel_core.evaluation import pass_at_k

    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_small_cases_by_hand():
    from propel_core.evaluation import pass_at_k

    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 3 of the 6 pairs hold the one pass
    assert pass_at_k(4, 3, 2) == 1.0  # any pair holds a pass
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_paired_comparison():
    from propel_core.evaluation import paired_comparison

    result = paired_comparison([1.0, 0.5, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0])
    assert (result["wins"], result["losses"], result["ties"]) == (2, 1, 1)
    assert result["mean_difference"] == pytest.approx(0.375)
    low, high = result["ci95"]
    assert -0.5 <= low <= 0.375 <= high <= 1.0
    same = paired_comparison([0.3] * 5, [0.3] * 5)
    assert same["ci95"] == (0.0, 0.0) and same["ties"] == 5


def test_paired_comparison_over_seeds_by_hand():
    """Two seeds of one pair each, differences 0 and 1: a two-level resample draws seeds (0, 0),
    (0, 1), (1, 0) or (1, 1), so its mean is 0, 0.5 or 1 with chances 1/4, 1/2, 1/4, and the 95%
    interval runs from 0 to 1."""
    from propel_core.evaluation import paired_comparison

    result = paired_comparison([0.0, 1.0], [0.0, 0.0], groups=["a", "b"], resamples=4000)
    assert result["ci95"] == (0.0, 1.0) and result["groups"] == 2
    assert result["mean_difference"] == 0.5


def test_paired_comparison_over_seeds_carries_the_spread_between_seeds():
    """One seed gains on every prompt, the other on none: prompts alone look certain (a narrow
    interval around 0.5), seeds resampled too show that the gain depends on the seed."""
    from propel_core.evaluation import paired_comparison

    ours, base = [1.0] * 100 + [0.0] * 100, [0.0] * 200
    flat = paired_comparison(ours, base)
    two_level = paired_comparison(ours, base, groups=[0] * 100 + [1] * 100)
    assert flat["ci95"][0] > 0.35 and flat["ci95"][1] < 0.65
    assert two_level["ci95"] == (0.0, 1.0)
    with pytest.raises(ValueError, match="one group per pair"):
        paired_comparison(ours, base, groups=[0])


def test_paired_comparison_over_seeds_gives_a_t_interval_by_hand():
    """Three seeds whose own mean shifts are 0.1, 0.2 and 0.3: the t-interval is 0.2 -+ t(2 df,
    97.5%) x sd / sqrt(3) = 0.2 -+ 4.303 x 0.1 / 1.732, and the verdict goes by it."""
    from propel_core.evaluation import paired_comparison, verdict_sentence

    ours = [0.1, 0.1, 0.2, 0.2, 0.3, 0.3]
    result = paired_comparison(ours, [0.0] * 6, groups=["a", "a", "b", "b", "c", "c"])
    assert result["group_means"] == pytest.approx([0.1, 0.2, 0.3])
    half = 4.303 * 0.1 / 3**0.5
    assert result["seed_t95"] == pytest.approx((0.2 - half, 0.2 + half))
    assert result["ci95"][0] > 0  # the bootstrap over three seeds alone would call it a gain
    sentence = verdict_sentence({"hard": result}, 0.1, {"base": 0.1, "hard": 0.3}, "over 3 seeds")
    assert (
        "hard did not clearly change utility" in sentence and "95% t-interval over 3 seeds [-0.048, +0.448]" in sentence
    )
    assert "seed_t95" not in paired_comparison(ours, [0.0] * 6)  # one group: no seeds to spread over
