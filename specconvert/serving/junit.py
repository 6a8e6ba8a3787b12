"""JUnit XML in the common schema (testsuites > testsuite > testcase > failure|error|skipped).

The attributes CI tools require are always written: ``testsuite@name/tests/failures/errors``,
``testcase@name/classname/time``, ``failure@message/type``. Text goes through ElementTree,
so prompts and model output are escaped safely.
"""

from __future__ import annotations

import socket
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Case:
    name: str
    classname: str
    time_s: float = 0.0
    status: str = "passed"  # passed | failed | error | skipped
    message: str = ""
    details: str = ""


@dataclass
class Suite:
    name: str
    cases: list[Case] = field(default_factory=list)

    def add(self, case: Case) -> Case:
        self.cases.append(case)
        return case


def _count(cases: list[Case], status: str) -> int:
    return sum(1 for c in cases if c.status == status)


def _clean(text: str) -> str:
    # XML 1.0 forbids most control characters; model output may contain them.
    return "".join(ch for ch in str(text) if ch in "\t\n\r" or ord(ch) >= 0x20)


def render(suites: list[Suite], name: str) -> bytes:
    every = [c for s in suites for c in s.cases]
    root = ET.Element("testsuites", {
        "name": name, "tests": str(len(every)), "failures": str(_count(every, "failed")),
        "errors": str(_count(every, "error")), "skipped": str(_count(every, "skipped")),
        "time": f"{sum(c.time_s for c in every):.3f}",
    })
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    for index, suite in enumerate(suites):
        node = ET.SubElement(root, "testsuite", {
            "name": suite.name, "tests": str(len(suite.cases)), "failures": str(_count(suite.cases, "failed")),
            "errors": str(_count(suite.cases, "error")), "skipped": str(_count(suite.cases, "skipped")),
            "time": f"{sum(c.time_s for c in suite.cases):.3f}", "timestamp": stamp,
            "hostname": socket.gethostname() or "localhost", "id": str(index),
        })
        for case in suite.cases:
            element = ET.SubElement(node, "testcase", {"name": _clean(case.name), "classname": case.classname,
                                                       "time": f"{case.time_s:.3f}"})
            if case.status in ("failed", "error"):
                tag = "failure" if case.status == "failed" else "error"
                child = ET.SubElement(element, tag, {"message": _clean(case.message)[:500],
                                                     "type": "CheckFailed" if tag == "failure" else "ServerError"})
                child.text = _clean(case.details or case.message)
            elif case.status == "skipped":
                ET.SubElement(element, "skipped", {"message": _clean(case.message)})
    ET.indent(root)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8")


def write(path: Path, suites: list[Suite], name: str) -> None:
    Path(path).write_bytes(render(suites, name))
