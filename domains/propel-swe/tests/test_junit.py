"""Test outcomes from a JUnit XML report."""

import pytest

from propel_core.errors import PropelError
from propel_swe.junit import parse_junit

REPORT = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_core" name="test_ok" time="0.001"/>
<testcase classname="tests.test_core" name="test_bad"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.test_core" name="test_setup"><error message="fixture failed">trace</error></testcase>
<testcase classname="tests.test_core" name="test_later"><skipped message="not today"/></testcase>
<testcase classname="tests.test_core" name="test_bad"><error message="teardown">trace</error></testcase>
</testsuite></testsuites>"""


def test_outcomes():
    assert parse_junit(REPORT) == {
        "tests.test_core::test_ok": "passed",
        "tests.test_core::test_bad": "failed",  # a teardown error after a failure keeps the failure
        "tests.test_core::test_setup": "error",
        "tests.test_core::test_later": "skipped",
    }


def test_not_xml():
    with pytest.raises(PropelError, match="not a JUnit XML report"):
        parse_junit(b"all 5 tests passed")
