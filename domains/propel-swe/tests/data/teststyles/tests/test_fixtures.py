import pytest

from styles.core import double


@pytest.fixture(autouse=True)
def seven(monkeypatch):
    monkeypatch.setenv("STYLES_BASE", "7")


def test_doubles_what_the_fixture_set():
    import os

    assert double(int(os.environ["STYLES_BASE"])) == 14


@pytest.mark.parametrize("x, y", [(1, 2), (0, 0)])
def test_doubles_each(x, y):
    assert double(x) == y
