"""RunReport (agent/testing/peer/report.py): p50/p95 of each figure over the calls of a run."""

from __future__ import annotations

import json

import pytest

from agent.testing.peer.report import CallReport, CheckResult, RunReport, percentile


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(1, 101))), 95) == pytest.approx(95.05)


def test_aggregates_cover_measurements_and_check_values() -> None:
    calls = []
    for i in range(10):
        calls.append(CallReport(
            connected=True, seconds_received=1.0, delay_ms=100.0 + i, pesq=4.0,
            response_latency_ms=[200.0 + i, 300.0 + i],
            checks=[CheckResult("02_expect_speech", i < 9, 0.2 + i / 100, 1.5, "s")]))
    run = RunReport(calls, seconds=5.0, concurrency=4)
    aggregates = run.aggregates()
    assert aggregates["delay_ms"] == {"n": 10, "p50": 104.5, "p95": 108.55}
    assert aggregates["response_latency_ms"]["n"] == 20
    assert aggregates["check:02_expect_speech"]["p50"] == pytest.approx(0.245)
    assert "jitter_ms" not in aggregates  # no call measured it
    body = json.loads(json.dumps(run.to_json()))
    assert body["ok"] is False and body["passed"] == 9 and body["failed"] == 1
    assert body["concurrency"] == 4 and len(body["calls"]) == 10
