"""Expectations judged from step traces and speech segments (agent/testing/peer/checks.py):
the measured value, the threshold and the verdict, for passing and failing cases."""

from __future__ import annotations

from typing import Any

import pytest

from agent.testing.peer.checks import basic, caller_reference, judge
from agent.testing.peer.report import CallReport
from agent.testing.peer.script import Step
from agent.testing.peer.steps import StepTrace
from agent.testing.peer.vad import Segment


def trace(kind: str, start: float, index: int = 1, error: str | None = None,
          **args: Any) -> StepTrace:
    observed = args.pop("observed", {})
    return StepTrace(Step(index, kind, args), start, start + 1, error, observed)


CALLER = [Segment(0.5, 1.5), Segment(4.0, 4.4)]


def test_response_latency_runs_from_the_callers_last_speech_end() -> None:
    agent = [Segment(2.1, 3.0)]
    [check] = judge([trace("expect_speech", 1.6, within=1.5)], CALLER, agent, 10)
    assert check.passed and check.value == pytest.approx(0.6) and check.threshold == 1.5
    assert check.unit == "s" and check.t == pytest.approx(2.1)
    [late] = judge([trace("expect_speech", 1.6, within=0.5)], CALLER, agent, 10)
    assert not late.passed and late.value == pytest.approx(0.6) and "> 0.5 s" in late.message


def test_an_agent_still_speaking_answers_at_once_and_silence_fails() -> None:
    [check] = judge([trace("expect_speech", 1.6)], CALLER, [Segment(1.0, 2.0)], 10)
    assert check.passed and check.value == 0.0
    [none] = judge([trace("expect_speech", 1.6)], CALLER, [], 10)
    assert not none.passed and none.value is None and none.threshold == 1.5


def test_the_reference_is_the_step_start_when_the_caller_had_not_spoken() -> None:
    assert caller_reference([], 2.0) == 2.0
    assert caller_reference(CALLER, 1.55) == 1.5
    assert caller_reference(CALLER, 4.2) == 1.5  # still speaking at 4.2: the earlier end


def test_barge_in_stop_time_from_the_interruption_to_the_agents_stop() -> None:
    step = trace("barge_in", 3.0, expect_stop_within_ms=400, observed={"barge_at": 3.9})
    agent = [Segment(2.5, 4.3)]
    [check] = judge([step], CALLER, agent, 10)
    assert check.passed and check.value == pytest.approx(300.0) and check.unit == "ms"
    step.step.args["expect_stop_within_ms"] = 200
    [strict] = judge([step], CALLER, agent, 10)
    assert not strict.passed and strict.value == pytest.approx(300.0)
    assert strict.threshold == 200


def test_barge_in_on_an_agent_that_never_stops_or_never_spoke() -> None:
    step = trace("barge_in", 3.0, observed={"barge_at": 3.9})
    [talking] = judge([step], CALLER, [Segment(2.5, 10.0)], 10.0)
    assert not talking.passed and talking.value is None and "did not stop" in talking.message
    silent = trace("barge_in", 3.0, observed={"no_speech": True})
    [nothing] = judge([silent], CALLER, [], 10.0)
    assert not nothing.passed and "did not speak" in nothing.message


def test_timed_expectations_and_failed_actions() -> None:
    traces = [
        trace("expect_event", 1.0, 1, type="session.updated", within=2,
              observed={"event_at": 1.25}),
        trace("expect_transcript", 1.0, 2, contains="hello", within=1,
              observed={"transcript": "goodbye"}),
        trace("expect_hangup", 5.0, 3, within=3, observed={"ended_at": 6.5}),
        trace("dtmf", 2.0, 4, error="unsupported: no DTMF here", value="1"),
        trace("play", 0.0, 5),
    ]
    event, transcript, hangup, dtmf = judge(traces, [], [], 10)
    assert event.passed and event.value == 0.25 and event.name == "01_expect_event"
    assert not transcript.passed and "'goodbye'" in transcript.message
    assert hangup.passed and hangup.value == 1.5
    assert not dtmf.passed and dtmf.message == "unsupported: no DTMF here"


def test_basic_checks_of_a_call() -> None:
    refused = CallReport(error="offer refused: HTTP 401", error_code="refused")
    [connected] = basic(refused)
    assert not connected.passed and "[refused]" in connected.message
    fine = CallReport(connected=True, connect_seconds=0.1, seconds_received=2.0)
    assert [c.passed for c in basic(fine)] == [True, True, True]
    ended = CallReport(connected=True, seconds_received=1.0, error="ended", error_code="closed")
    assert [c.name for c in basic(ended) if not c.passed] == ["call_completed"]
