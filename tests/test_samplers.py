"""Context samplers: the progress sampler's probabilities on hand-made statistics."""

import math

import pytest

from propel_core.records import Context


def contexts(sizes: dict[str, int]) -> list[Context]:
    return [Context(id=f"{bucket}-{i}", data={}, bucket=bucket) for bucket, n in sizes.items() for i in range(n)]


@pytest.fixture
def progress(propel_registry):
    return lambda pool, **options: propel_registry.get("context_samplers", "progress")(pool, seed=0, **options)


def test_without_data_every_bucket_keeps_its_prior(progress):
    pool = contexts({"a": 6, "b": 3, "c": 1})
    assert progress(pool).probabilities() == pytest.approx({"a": 0.6, "b": 0.3, "c": 0.1})
    assert progress(pool, prior="uniform").probabilities() == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})


def test_emas_progress_variance_and_the_softmax_mixture(progress):
    pool = contexts({"a": 1, "b": 1})
    sampler = progress(pool, prior="uniform", epsilon=0.2, tau=0.2, lam=0.5)
    a, b = pool
    sampler.update([a, a, b, b], [0.0, 0.0, 1.0, 0.0])  # first data: short = long = the mean
    assert (sampler.short, sampler.long) == ({"a": 0.0, "b": 0.5}, {"a": 0.0, "b": 0.5})
    assert sampler.variance == {"a": 0.0, "b": 0.25}
    sampler.update([a, a, b, b], [1.0, 1.0, 1.0, 0.0])
    # a: short 0 + 0.3 * 1 = 0.3, long 0.03 -> LP 0.27, I 0; b: short and long stay 0.5, I 0.25
    assert sampler.short["a"] == pytest.approx(0.3) and sampler.long["a"] == pytest.approx(0.03)
    u_a, u_b = 0.5 * 0.27, 0.5 * 0.25
    assert sampler.utility("a") == pytest.approx(u_a) and sampler.utility("b") == pytest.approx(u_b)
    soft_a = math.exp(u_a / 0.2) / (math.exp(u_a / 0.2) + math.exp(u_b / 0.2))
    expected_a = 0.8 * soft_a + 0.2 * 0.5
    assert sampler.probabilities() == pytest.approx({"a": expected_a, "b": 1 - expected_a})
    assert sampler.diagnostics()["degenerate_groups"] == 0.5  # a's group is all 1.0


def test_a_bucket_without_data_keeps_its_prior_mass(progress):
    pool = contexts({"a": 2, "b": 1, "c": 1})
    sampler = progress(pool, prior="empirical", epsilon=0.2, tau=0.2)
    sampler.update([pool[0], pool[0], pool[2], pool[2]], [0.0, 1.0, 0.0, 0.0])  # a and b have data
    probabilities = sampler.probabilities()
    assert probabilities["c"] == pytest.approx(0.25)
    u_a, u_b = 0.5 * 0.25, 0.0
    soft_a = math.exp(u_a / 0.2) / (math.exp(u_a / 0.2) + math.exp(u_b / 0.2))
    assert probabilities["a"] == pytest.approx(0.75 * (0.8 * soft_a + 0.2 * (0.5 / 0.75)))
    assert sum(probabilities.values()) == pytest.approx(1.0)


def test_cap_moves_the_excess_to_the_other_buckets(progress):
    pool = contexts({"a": 8, "b": 1, "c": 1})
    assert progress(pool, max_probability=0.5).probabilities() == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})
    with pytest.raises(ValueError, match="no distribution fits under the cap"):
        progress(pool, max_probability=0.3)


def test_density_ratio_clipping_against_the_empirical_prior(progress):
    pool = contexts({"a": 5, "b": 5})
    sampler = progress(pool, prior="uniform", epsilon=0.0, tau=0.05, density_ratio=[0.5, 1.5])
    a, b = pool[0], pool[5]
    sampler.update([a, a, b, b], [0.0, 1.0, 0.0, 0.0])  # a: variance 0.25, b: 0 -> a dominates the softmax
    raw_a = math.exp(0.125 / 0.05) / (math.exp(0.125 / 0.05) + 1)
    assert raw_a > 0.75  # above 1.5 x its data share: clipped to 0.75, b raised to 0.25
    assert sampler.probabilities() == pytest.approx({"a": 0.75, "b": 0.25})


def test_bucketing_choices(progress):
    pool = contexts({"a": 10, "b": 10})
    assert len(progress(pool, buckets="prompt").names) == 20
    partitions = progress(pool, buckets=4).names
    assert 1 < len(partitions) <= 4 and all(name.startswith("partition ") for name in partitions)
    assert progress(pool, buckets=4).bucket_of == progress(pool, buckets=4).bucket_of  # seeded
    with pytest.raises(ValueError, match="buckets must be"):
        progress(pool, buckets="topic")


def test_sampling_follows_the_probabilities(progress):
    pool = contexts({"a": 9, "b": 1})
    drawn = progress(pool).sample(2000)
    share_a = sum(c.bucket == "a" for c in drawn) / len(drawn)
    assert abs(share_a - 0.9) < 0.03
