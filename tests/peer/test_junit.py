"""JUnit XML (agent/testing/peer/junit.py) read back by junitparser and xml.etree: a testcase
per check, failures carrying the measured value and the threshold."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from junitparser import Failure, JUnitXml

from agent.testing.peer import junit
from agent.testing.peer.report import CallReport, CheckResult, RunReport


def call(name: str, *checks: CheckResult) -> CallReport:
    return CallReport(connected=True, seconds_received=1.0, name=name, transport="webrtc",
                      url="http://127.0.0.1:1", checks=list(checks))


def test_one_testcase_per_check_and_failures_say_what_was_measured(tmp_path: Path) -> None:
    run = RunReport([call("greeting",
                          CheckResult("connected", True, 0.05, None, "s", "connected"),
                          CheckResult("02_expect_speech", False, 2.1, 1.5, "s", "too slow"),
                          CheckResult("03_barge_in", False, None, 400.0, "ms", "never spoke"))],
                    seconds=3.0)
    path = tmp_path / "out.xml"
    junit.write(str(path), run)
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert len(suites) == 1 and suites[0].name == "greeting"
    cases = {case.name: case for case in suites[0]}
    assert list(cases) == ["connected", "02_expect_speech", "03_barge_in"]
    assert cases["connected"].is_passed
    [failure] = cases["02_expect_speech"].result
    assert isinstance(failure, Failure)
    assert failure.message == "measured 2.1 s, threshold 1.5 s: too slow"
    [missing] = cases["03_barge_in"].result
    assert "measured none, threshold 400 ms" in (missing.message or "")
    assert suites[0].tests == 3 and suites[0].failures == 2
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites" and root.get("failures") == "2"
    assert cases["connected"].classname == "peer.greeting"


def test_repeated_calls_are_numbered_suites(tmp_path: Path) -> None:
    run = RunReport([call("load", CheckResult("connected", True)) for _ in range(3)])
    path = tmp_path / "out.xml"
    junit.write(str(path), run)
    names = [suite.name for suite in JUnitXml.fromfile(str(path))]
    assert names == ["load #1", "load #2", "load #3"]
