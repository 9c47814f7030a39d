"""A load run (`run_calls` with plain calls in the load-test mode) against this agent (the echo
plugin, on loopback): every call is measured and judged, and only once the last call has
ended, so the analysis never competes with calls still running."""

from __future__ import annotations

import time

import pytest

from agent.testing.peer import run as runs
from agent.testing.peer.report import CallReport
from agent.testing.peer.run import CallPlan, analysed_after_the_run, run_calls
from agent.testing.peer.script import Script
from agent.testing.peer.transports.base import PeerCall, PeerOptions
from tests.support.agents import RunningAgent

LOAD_TEST = PeerOptions(timeout=20.0, extra={"defer_decoding": True})


def test_only_plain_load_test_calls_wait_for_the_end_of_the_run() -> None:
    assert analysed_after_the_run(CallPlan("http://x", options=LOAD_TEST))
    assert not analysed_after_the_run(CallPlan("http://x"))
    scripted = CallPlan("http://x", options=LOAD_TEST, script=Script("s", []))
    assert not analysed_after_the_run(scripted)


async def test_a_load_run_measures_its_calls_after_the_last_has_ended(
        echo_agent: RunningAgent, monkeypatch: pytest.MonkeyPatch) -> None:
    ended: list[float] = []
    measured: list[float] = []
    place_call, measure_into = runs.place_call, runs.measure_into

    async def placing(*args: object, **kwargs: object) -> tuple[CallReport, PeerCall | None]:
        placed = await place_call(*args, **kwargs)  # type: ignore[arg-type]
        ended.append(time.monotonic())
        return placed

    def measuring(report: CallReport, call: PeerCall, echo: bool = True) -> CallReport:
        measured.append(time.monotonic())
        return measure_into(report, call, echo)

    monkeypatch.setattr(runs, "place_call", placing)
    monkeypatch.setattr(runs, "measure_into", measuring)
    plan = CallPlan(echo_agent.url, "rtp", LOAD_TEST, seconds=1.5, pesq="off")
    run = await run_calls(plan, repeat=3, concurrency=2, progress=False)
    assert len(ended) == len(measured) == 3
    assert min(measured) >= max(ended)  # the third call started after the first had ended
    for report in run.calls:
        assert report.ok, report
        assert report.correlation is not None and report.correlation > 0.8
        assert report.checks and report.agent_speech
    # The peer's own load: what it spent while the calls ran and measuring them afterwards.
    own = run.own_load
    assert own is not None and own.seconds > 3.0  # two rounds of 1.5 s calls
    assert 0 < own.loop_cpu_seconds <= own.process_cpu_seconds + 0.01
    assert own.call_seconds >= 3 * 1.4 and own.analysis_cpu_seconds > 0
    assert own.cpu_per_call_second is not None and own.cpu_per_call_second > 0
    assert own.warning() is None  # three RTP calls are nothing to the peer
    assert run.to_json()["peer_load"]["tick_late_max_ms"] == round(own.tick_late_max_ms, 1)
