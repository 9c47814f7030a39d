"""Scripts run against the real agent (echo plugin, in-process server on loopback) with a real
aiortc caller: each expectation measured on the recordings, each action's failure reported.

The echo's `delay_frames` gives the agent a known answer time. The checks' values are compared
with what the same recording shows, measured the same way: the speech edges of both channels
(the check's own logic), and where the caller's burst came back on the agent channel
(cross-correlation of a 200 ms piece of it, on the same aligned timeline). A late packet or a
hole under load moves the agent's audio on that timeline for both measurements alike, so the
tolerances are those of the edges (a 20 ms packet), not of the machine's speed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.testing.peer import script as scripts
from agent.testing.peer.aligned import JUMP_SECONDS, CallAudio
from agent.testing.peer.checks import EDGE_SLACK, judge
from agent.testing.peer.run import CallPlan, analyse, run_script
from agent.testing.peer.transports.base import PeerOptions
from agent.testing.peer.wav import save_wav
from tests.peer.speech import RATE, padded, sharp_burst
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.text_echo_plugin import TextEchoPlugin

pytestmark = pytest.mark.slow


def plan_for(url: str, steps: list[Any], tmp_path: Path, delay_frames: int = 0,
             transport: str = "webrtc") -> CallPlan:
    script = scripts.build({"name": "t", "steps": steps}, "t", str(tmp_path))
    session = {"extra_body": {"delay_frames": delay_frames}} if delay_frames else None
    return CallPlan(url=url, transport=transport, script=script, pesq="off",
                    options=PeerOptions(session=session, ice_host=["127.0.0.1"]))


# How far load may move an edge of the agent's speech on the aligned timeline: a packet that
# comes late or not at all (concealed) shifts what follows by up to JUMP_SECONDS before the
# alignment re-anchors on arrival times (aligned.py).
SHIFT = JUMP_SECONDS


def locate(piece: np.ndarray, audio: np.ndarray) -> tuple[float, float]:
    """Where `piece` best matches in `audio` (seconds) and the normalized correlation there."""
    size = 1 << int(np.ceil(np.log2(len(audio) + len(piece))))
    xcorr = np.fft.irfft(np.fft.rfft(audio, size) * np.conj(np.fft.rfft(piece, size)), size)
    at = int(np.argmax(xcorr[: len(audio) - len(piece) + 1]))
    there = audio[at : at + len(piece)]
    norm = float(np.sqrt(np.sum(piece * piece) * np.sum(there * there)))
    return at / RATE, float(np.dot(piece, there)) / norm if norm else 0.0


async def test_response_latency_barge_in_and_failed_actions(echo_agent: RunningAgent,
                                                            tmp_path: Path) -> None:
    long_burst = sharp_burst(1.2)
    save_wav(str(tmp_path / "long.wav"), padded(long_burst))
    save_wav(str(tmp_path / "short.wav"), sharp_burst(0.3, seed=12))
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
    # Where the 1.2 s burst (sharp 5 ms edges) started and ended, and where those came back:
    # 200 ms pieces of it found in both
    # channels of the aligned recording. The echo repeats them 20 x 80 ms later plus the
    # path's own delay.
    audio = CallAudio.of(call.sent, call.received)
    head, tail = long_burst[int(0.1 * RATE) : int(0.3 * RATE)], long_burst[-int(0.3 * RATE) :
                                                                          -int(0.1 * RATE)]
    (sent_head, _), (back_head, head_score) = locate(head, audio.caller), locate(head,
                                                                                 audio.agent)
    (sent_tail, _), (back_tail, tail_score) = locate(tail, audio.caller), locate(tail,
                                                                                 audio.agent)
    assert head_score > 0.5 and tail_score > 0.5, (head_score, tail_score)
    onset_delay, end_delay = back_head - sent_head, back_tail - sent_tail
    assert 1.6 <= onset_delay < 1.6 + 1.0  # delay_frames, plus a path delay load may stretch
    # The caller's segments as the checks take them: the burst's (more than one if a stall
    # of the sender under load cut it) before the barge-in, then the interruption.
    barge_trace = next(t for t in traces if t.step.kind == "barge_in")
    barge_at = barge_trace.observed["barge_at"]
    before = [s for s in report.caller_speech if s[1] <= barge_at]
    long_start, long_end = before[0][0], before[-1][1]
    short_start = next(s[0] for s in report.caller_speech if s[0] >= barge_at - EDGE_SLACK)
    agent_start = report.agent_speech[0][0]
    segments = f"caller {report.caller_speech} agent {report.agent_speech}"
    # The response latency is the agent's first speech edge after the caller's last one...
    latency = checks["02_expect_speech"]
    assert latency.passed and isinstance(latency.value, float)
    assert latency.value == pytest.approx(agent_start - long_end, abs=0.0015)
    # ...and those edges sit where the audio says: the agent's onset one echo delay after the
    # caller's (both edges found the same way, on the same fade-in of the burst).
    assert agent_start - long_start == pytest.approx(onset_delay, abs=SHIFT), segments
    # Barging in 0.3 s into the echo of a 1.2 s burst: the echo goes on until the burst's
    # end comes back, ~0.9 s later. The stop time runs from the caller's interruption to the
    # end of the agent speech it talked over, which ends one echo delay after the burst.
    barge = checks["03_barge_in"]
    assert barge.passed and isinstance(barge.value, float), barge.message
    covering = [end for start, end in report.agent_speech if start <= short_start < end]
    assert covering, segments
    echo_end = covering[0]
    assert barge.value == pytest.approx((echo_end - short_start) * 1000, abs=1.5)
    assert echo_end - long_end == pytest.approx(end_delay, abs=SHIFT), segments
    # The caller cut in after the agent started (so > 0) and at least 0.3 s into the echo of
    # the burst (1.2 s, longer on the caller's timeline if the sender stalled).
    assert 0 < barge.value < (long_end - long_start - 0.3 + SHIFT) * 1000, segments
    assert report.barge_in_stop_ms == [barge.value]
    # The same measurement held to a tighter limit fails, with the value and the limit.
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
