import unittest

import pytest

from styles.core import double

ready = []


def setup_module():
    ready.append("module")


def setup_function():
    ready.append("function")


def test_module_and_function_set_up():
    assert ready[:2] == ["module", "function"] and double(2) == 4


class TestClassSetUpWithoutClassmethod:
    def setup_class(cls):
        cls.base = 3

    def setup_method(self):
        self.twice = double(self.base)

    def test_doubles(self):
        assert self.twice == 6


class TestRaises:
    def test_doubles_and_refuses_nothing(self):
        with pytest.raises(TypeError):
            double(None)
        assert double(5) == 10


class TestUnittestClassSetUp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.value = double(4)

    def test_doubles(self):
        self.assertEqual(self.value, 8)
