"""Structure check of JUnit XML against the common schema (the Jenkins/Ant junit-10 layout CI tools read)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path


def validate(path: Path) -> ET.Element:
    """Raise AssertionError on any departure from testsuites > testsuite > testcase > failure|error|skipped."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites", root.tag
    suites = list(root)
    assert suites and all(s.tag == "testsuite" for s in suites)
    total = {"tests": 0, "failures": 0, "errors": 0}
    for suite in suites:
        for attr in ("name", "tests", "failures", "errors"):
            assert attr in suite.attrib, f"testsuite lacks required @{attr}"
        cases = list(suite)
        assert all(c.tag == "testcase" for c in cases), [c.tag for c in cases]
        failures = sum(1 for c in cases for x in c if x.tag == "failure")
        errors = sum(1 for c in cases for x in c if x.tag == "error")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == failures and int(suite.get("errors")) == errors
        for case in cases:
            assert case.get("name") and case.get("classname"), case.attrib
            float(case.get("time"))
            children = list(case)
            assert len(children) <= 1 and all(x.tag in ("failure", "error", "skipped") for x in children)
            for x in children:
                if x.tag in ("failure", "error"):
                    assert x.get("message") is not None and x.get("type"), x.attrib
        total["tests"] += len(cases)
        total["failures"] += failures
        total["errors"] += errors
    for key, value in total.items():
        assert int(root.get(key)) == value, (key, root.get(key), value)
    return root
