"""Scripts run against the real agent (echo plugin, in-process server on loopback) with a real
aiortc caller: each expectation measured on the recordings, each action's failure reported.

The echo's `delay_frames` gives the agent a known answer time; the values are compared with
the cross-correlation delay of the same call, not with a wall-clock limit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.testing.peer import script as scripts
from agent.testing.peer.checks import judge
from agent.testing.peer.measure import echo_delay
from agent.testing.peer.run import CallPlan, analyse, run_script
from agent.testing.peer.transports.base import PeerOptions
from agent.testing.peer.wav import save_wav
from tests.peer.speech import bursts
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.text_echo_plugin import TextEchoPlugin

pytestmark = pytest.mark.slow


def plan_for(url: str, steps: list[Any], tmp_path: Path, delay_frames: int = 0,
             transport: str = "webrtc") -> CallPlan:
    script = scripts.build({"name": "t", "steps": steps}, "t", str(tmp_path))
    session = {"extra_body": {"delay_frames": delay_frames}} if delay_frames else None
    return CallPlan(url=url, transport=transport, script=script, pesq="off",
                    options=PeerOptions(session=session, ice_host=["127.0.0.1"]))


async def test_response_latency_barge_in_and_failed_actions(echo_agent: RunningAgent,
                                                            tmp_path: Path) -> None:
    save_wav(str(tmp_path / "long.wav"), bursts([(0.0, 1.2)], 1.2))
    save_wav(str(tmp_path / "short.wav"), bursts([(0.0, 0.3)], 0.3))
    plan = plan_for(echo_agent.url, [
        {"play": "long.wav"},
        {"expect_speech": {"within": 3.0}},
        {"barge_in": {"after_speech_starts": 0.3, "expect_stop_within_ms": 1500,
                      "play": "short.wav"}},
        {"dtmf": "1"},
        {"session_update": {"instructions": "be brief"}},
        {"expect_event": {"type": "session.updated", "within": 3}},
        "hangup",
    ], tmp_path, delay_frames=20)
    report, call, traces = await run_script(plan)
    assert call is not None and report.error is None, report.error
    analyse(plan, report, call, traces, 0)
    checks = {check.name: check for check in report.checks}
    assert checks["connected"].passed and checks["audio_received"].passed
    # The agent echoes 1.6 s (+ the path's own delay) after the caller starts a 1.2 s burst:
    # it answers about 0.4 s + path delay after the caller stops.
    echo = echo_delay(call.sent, call.received)
    assert echo is not None and echo.correlation > 0.5
    latency = checks["02_expect_speech"]
    assert latency.passed and isinstance(latency.value, float)
    caller_speech = report.caller_speech[0][1] - report.caller_speech[0][0]
    assert latency.value == pytest.approx(echo.delay_ms / 1000 - caller_speech, abs=0.03)
    # Barging in 0.3 s into the echo of a 1.2 s burst: the echo goes on until the burst's
    # end comes back, ~0.9 s later.
    barge = checks["03_barge_in"]
    assert barge.passed and isinstance(barge.value, float), barge.message
    (_, long_end), (short_start, _) = report.caller_speech[:2]
    echo_end = long_end + echo.delay_ms / 1000
    assert barge.value == pytest.approx((echo_end - short_start) * 1000, abs=30)
    assert 600 < barge.value < 1000
    assert report.barge_in_stop_ms == [barge.value]
    # The same measurement held to a tighter limit fails, with the value and the limit.
    barge_trace = next(t for t in traces if t.step.kind == "barge_in")
    barge_trace.step.args["expect_stop_within_ms"] = 400
    strict = judge([barge_trace], [_seg(s) for s in report.caller_speech],
                   [_seg(s) for s in report.agent_speech], 60.0)[0]
    assert not strict.passed and strict.value == barge.value and strict.threshold == 400
    # WebRTC has no DTMF sender here: the action fails as a check saying so.
    dtmf = checks["04_dtmf"]
    assert not dtmf.passed and dtmf.message.startswith("unsupported")
    event = checks["06_expect_event"]
    assert event.passed and isinstance(event.value, float) and event.value <= 3


def _seg(pair: list[float]) -> Any:
    from agent.testing.peer.vad import Segment

    return Segment(pair[0], pair[1])


async def test_a_transcript_is_expected_from_the_agents_events(start_agent: AgentFactory,
                                                               tmp_path: Path) -> None:
    running = await start_agent(TextEchoPlugin(frames_per_word=2))
    plan = plan_for(running.url, [
        {"expect_transcript": {"contains": "THIS is  the test", "within": 5}},
        {"expect_transcript": {"contains": "goodbye", "within": 0.5}},
        "hangup",
    ], tmp_path)
    report, call, traces = await run_script(plan)
    analyse(plan, report, call, traces, 0)
    checks = {check.name: check for check in report.checks}
    found = checks["01_expect_transcript"]
    assert found.passed and isinstance(found.value, float) and 0 < found.value <= 5
    missing = checks["02_expect_transcript"]
    assert not missing.passed and missing.value is None
    assert "goodbye" in missing.message and "transcript:" in missing.message


async def test_the_agent_hanging_up_is_expected_or_is_an_error(echo_agent: RunningAgent,
                                                               tmp_path: Path) -> None:
    # On the media-stream websocket, which a server closes in one message.
    async def hang_up_soon() -> None:
        await wait_until(lambda: len(echo_agent.agent.legs) > 0)
        await asyncio.sleep(0.5)
        for leg in list(echo_agent.agent.legs):
            await leg.close("hangup")

    expecting = plan_for(echo_agent.url, [{"expect_hangup": {"within": 5}}], tmp_path,
                         transport="media-stream")
    closer = asyncio.ensure_future(hang_up_soon())
    report, call, traces = await run_script(expecting)
    await closer
    analyse(expecting, report, call, traces, 0)
    check = next(c for c in report.checks if c.name == "01_expect_hangup")
    assert check.passed and isinstance(check.value, float) and check.value < 5
    assert report.error is None

    # Not expected: the call ended early, and the steps after it fail saying so.
    surprised = plan_for(echo_agent.url, [{"silence": 5}, {"expect_speech": {"within": 1}}],
                         tmp_path, transport="media-stream")
    closer = asyncio.ensure_future(hang_up_soon())
    report, call, traces = await run_script(surprised)
    await closer
    analyse(surprised, report, call, traces, 0)
    assert report.error_code == "closed" and not report.ok
    assert not next(c for c in report.checks if c.name == "call_completed").passed
    after = next(c for c in report.checks if c.name == "02_expect_speech")
    assert not after.passed and "ended before this step" in after.message
