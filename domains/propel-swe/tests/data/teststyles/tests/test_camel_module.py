from styles.core import double

state = {}


def setUpModule():
    state["value"] = double(6)


def test_doubles():
    assert state["value"] == 12
