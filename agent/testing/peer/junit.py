"""JUnit XML of a run: one `<testsuite>` per call, one `<testcase>` per check; a failed
check's `<failure>` carries its measured value and threshold.

Written with `xml.etree` from the standard library: the format is a handful of elements (the
schema Jenkins, GitHub's and GitLab's test reports read), too small to need a dependency at
run time; the tests read the files back with `junitparser`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from agent.testing.peer.report import CallReport, CheckResult, RunReport


def _value(value: float | str | None, unit: str) -> str:
    if value is None:
        return "none"
    return f"{value:g} {unit}".strip() if isinstance(value, float | int) else f"{value} {unit}"\
        .strip()


def failure_text(check: CheckResult) -> str:
    """One line: what was measured against what it was held to, and why."""
    return (f"measured {_value(check.value, check.unit)}, threshold "
            f"{_value(check.threshold, check.unit)}: {check.message}")


def _suite(parent: ET.Element, report: CallReport, index: int, total: int) -> None:
    name = report.name or "call"
    if total > 1:
        name = f"{name} #{index + 1}"
    failures = sum(1 for check in report.checks if not check.passed)
    suite = ET.SubElement(parent, "testsuite", name=name, tests=str(len(report.checks)),
                          failures=str(failures), errors="0", skipped="0",
                          time=f"{report.seconds_sent:.3f}")
    props = ET.SubElement(suite, "properties")
    for key in ("transport", "url", "call_id", "codec", "delay_ms", "first_audio_ms",
                "jitter_ms", "pesq"):
        value = getattr(report, key)
        if value is not None:
            ET.SubElement(props, "property", name=key, value=str(value))
    for check in report.checks:
        case = ET.SubElement(suite, "testcase", classname=f"peer.{report.name or 'call'}",
                             name=check.name, time="0")
        if not check.passed:
            failure = ET.SubElement(case, "failure", message=failure_text(check),
                                    type="check_failed")
            failure.text = failure_text(check)
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"measured {_value(check.value, check.unit)}: {check.message}"


def to_xml(run: RunReport) -> ET.ElementTree:
    root = ET.Element("testsuites", name="duplex-agent peer",
                      tests=str(sum(len(c.checks) for c in run.calls)),
                      failures=str(sum(1 for c in run.calls for k in c.checks if not k.passed)),
                      time=f"{run.seconds:.3f}")
    for index, report in enumerate(run.calls):
        _suite(root, report, index, len(run.calls))
    return ET.ElementTree(root)


def write(path: str, run: RunReport) -> None:
    tree = to_xml(run)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
