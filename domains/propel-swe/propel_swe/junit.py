"""Test results from a JUnit XML report, the machine-readable record the runner writes (never from
the output of the code under test, which can print anything)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from propel_core.errors import PropelError

MAX_REPORT_BYTES = 32 << 20
OUTCOMES = ("passed", "failed", "error", "skipped")


def parse_junit(data: bytes) -> dict[str, str]:
    """``{test id: outcome}``; the id is ``classname::name``. ``failed`` is a failure inside the test
    (pytest's ``<failure>``), ``error`` a failure to collect or set it up."""
    if len(data) > MAX_REPORT_BYTES:
        raise PropelError(f"JUnit report larger than {MAX_REPORT_BYTES} bytes")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as exc:
        raise PropelError(f"not a JUnit XML report: {exc}") from None
    results: dict[str, str] = {}
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        if results.get(test_id) in ("error", "failed"):  # a test reported twice (call, then teardown)
            continue
        results[test_id] = outcome
    return results
