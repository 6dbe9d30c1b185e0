import pytest

from tinystats import clamp, is_sorted, mean, median, window


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_of_nothing():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([5, 1, 3]) == 3


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_clamp():
    assert [clamp(v, 0, 10) for v in (-5, 5, 15)] == [0, 5, 10]


def test_window():
    assert window([1, 2, 3, 4], 2) == [[1, 2], [2, 3], [3, 4]]


def test_is_sorted():
    assert is_sorted([1, 2, 2, 3])
    assert not is_sorted([2, 1])
