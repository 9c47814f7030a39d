"""The load-test media path of a WebRTC call (direct_srtp.py) against this agent (the echo
plugin, on loopback): aiortc's sender sends nothing, the agent still hears the caller and
echoes it, the kept packets are counted and decoded after the call, an agent that ends the
call is still noticed, and a call on an aiortc without the internals it reads stays on
aiortc's path and measures the same."""

from __future__ import annotations

import asyncio

import pytest

from agent.testing.peer.call import test_signal as signal_of
from agent.testing.peer.measure import measure_into
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports import direct_srtp
from agent.testing.peer.transports.base import PeerOptions, open_call
from agent.testing.peer.transports.webrtc import WebRtcCall
from tests.support.agents import RunningAgent, wait_until

LOAD_TEST = PeerOptions(timeout=20.0, extra={"defer_decoding": True})


async def echo_call(url: str, seconds: float = 2.0) -> tuple[WebRtcCall, CallReport]:
    call = open_call(url, "webrtc", LOAD_TEST)
    assert isinstance(call, WebRtcCall)
    try:
        await call.connect()
        call.play(signal_of(seconds))
        await asyncio.sleep(seconds)
        assert call.pc is not None
        stats = await call.pc.getSenders()[0].getStats()
        outbound = [s for s in stats.values() if s.type == "outbound-rtp"]
        await call.hangup()
    finally:
        await call.close()
    report = measure_into(CallReport(), call)
    if call._direct is not None:  # aiortc's own sender sent nothing: the direct path did
        assert outbound and outbound[0].packetsSent == 0
    return call, report


async def test_a_load_test_call_sends_and_keeps_its_audio_beside_aiortc(
        echo_agent: RunningAgent) -> None:
    call, report = await echo_call(echo_agent.url)
    assert call._direct is not None
    assert report.ok and report.correlation is not None and report.correlation > 0.8, report
    assert report.delay_ms is not None and 0 < report.delay_ms < 1500
    # Counted from the kept packets' sequence numbers and RTP timestamps after the call.
    assert report.packets_received is not None and report.packets_received > 80
    assert report.packets_lost == 0 and report.jitter_ms is not None
    assert report.gaps == 0 and call.received.seconds > 1.5
    await wait_until(lambda: not echo_agent.agent.legs and not echo_agent.agent.ticker.slots)


async def test_the_agent_ending_the_call_is_still_noticed(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "webrtc", LOAD_TEST)
    assert isinstance(call, WebRtcCall)
    try:
        await call.connect()
        assert call._direct is not None
        call.play(signal_of(4.0))
        await wait_until(lambda: len(echo_agent.agent.legs) > 0, timeout=10)
        await asyncio.sleep(0.5)
        for leg in list(echo_agent.agent.legs):
            await leg.close("hangup")
        await asyncio.wait_for(call.ended.wait(), 10)
        assert call.end_reason in ("remote_hangup", "media_timeout")
    finally:
        await call.close()


async def test_without_the_internals_it_reads_the_call_stays_on_aiortcs_path(
        echo_agent: RunningAgent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct_srtp.DirectSrtp, "available", staticmethod(lambda: False))
    monkeypatch.setattr(direct_srtp.DirectSrtp, "attach",
                        classmethod(lambda cls, *args: None))
    call, report = await echo_call(echo_agent.url)
    assert call._direct is None and call._deferred is not None
    assert report.ok and report.correlation is not None and report.correlation > 0.8, report
    assert report.gaps == 0 and call.received.seconds > 1.5
