"""Real aiortc peers call a real agent server over 127.0.0.1."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings
from agent.plugins.base import PluginSession
from agent.plugins.echo import EchoPlugin
from agent.testing.peer import PreencodedSignalTrack, SignalTrack, run_call
from agent.testing.testsignal import make_test_signal
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until


@pytest.mark.parametrize("codec", ["opus", "pcmu"])
async def test_caller_gets_its_test_signal_back(echo_agent: RunningAgent, codec: str) -> None:
    report, _, _ = await run_call(echo_agent.url, seconds=4.0, codec=codec)
    assert report.ok, report.error
    assert report.codec is not None and report.codec.lower() == codec
    assert report.correlation is not None and report.correlation >= 0.8
    # Continuous after the first second: every 250 ms of the signal came back recognisably,
    # and no packet gap long enough to be a dropout (stalls on a loaded runner are tolerated
    # up to what a receive jitter buffer absorbs).
    # A runner stalled for ~200 ms can cost two windows; a real dropout costs many more.
    assert report.holes is not None and report.holes <= 2
    assert report.max_gap_ms < 250, f"gaps: {report.gaps}, max {report.max_gap_ms} ms"
    assert report.seconds_received >= 3.5
    assert report.events[0] == "session.created"
    await wait_until(lambda: all_freed(echo_agent))


@pytest.mark.slow
async def test_a_load_generating_caller_judges_the_echo_after_the_call(
        echo_agent: RunningAgent) -> None:
    # The capacity benchmarks' callers: pre-encoded signal out, packets kept and decoded after
    # the call. A server that sent nothing, or silence, must still read as such.
    signal = make_test_signal(4.0)
    payloads = PreencodedSignalTrack.encode(signal, "opus")
    echoed, _, _ = await run_call(echo_agent.url, signal=signal, seconds=3.0, preencoded=payloads)
    assert echoed.ok, echoed.error
    assert echoed.seconds_received >= 2.5
    assert echoed.loud_fraction is not None and echoed.loud_fraction >= 0.95
    assert echoed.max_gap_ms < 250
    silent = PreencodedSignalTrack.encode(signal * 0.0, "opus")
    quiet, _, _ = await run_call(echo_agent.url, signal=signal, seconds=2.0, preencoded=silent)
    assert quiet.ok and quiet.seconds_received >= 1.5
    assert quiet.loud_fraction is None  # nothing loud came back
    await wait_until(lambda: all_freed(echo_agent))


@pytest.mark.slow
async def test_echo_delay_option_shifts_the_echo(echo_agent: RunningAgent) -> None:
    plain, _, _ = await run_call(echo_agent.url, seconds=3.0)
    delayed, _, _ = await run_call(
        echo_agent.url, seconds=3.0, session={"extra_body": {"delay_frames": 5}}
    )
    assert plain.ok and delayed.ok
    assert plain.delay_ms is not None and delayed.delay_ms is not None
    # Five 80 ms frames more; allow for scheduling noise on a loaded machine.
    assert 300 < delayed.delay_ms - plain.delay_ms < 500


async def test_a_closed_caller_frees_everything(echo_agent: RunningAgent) -> None:
    tasks_before = len(asyncio.all_tasks())
    for _ in range(3):
        report, _, _ = await run_call(echo_agent.url, seconds=1.0)
        assert report.ok
    await wait_until(lambda: all_freed(echo_agent))
    await asyncio.sleep(0.5)
    # The calls' own tasks are gone (aiortc keeps no per-call tasks after close either).
    leftover = [t for t in asyncio.all_tasks() if (t.get_name() or "").startswith("call_")]
    assert leftover == []
    assert len(asyncio.all_tasks()) <= tasks_before + 2


async def test_a_vanished_caller_is_ended_by_the_idle_timeout(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(call=CallSettings(idle_timeout=1.0)))
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    source = SignalTrack(make_test_signal(30.0))
    pc.addTrack(source)
    connected = asyncio.Event()
    pc.on("connectionstatechange", lambda: pc.connectionState == "connected" and connected.set())
    await pc.setLocalDescription(await pc.createOffer())
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + "/offer",
                             json={"sdp": pc.localDescription.sdp, "type": "offer"}) as response:
            answer = await response.json()
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
    await asyncio.wait_for(connected.wait(), 10)
    await wait_until(lambda: bool(running.agent.webrtc_legs))
    call = next(iter(running.agent.webrtc_legs.values()))
    await wait_until(lambda: call.watchdog.last_inbound_at is not None)
    # The caller's media stops without a goodbye: the transport stays up, no audio arrives.
    source.stop()
    for transceiver in pc.getTransceivers():
        await transceiver.sender.stop()
    await wait_until(lambda: all_freed(running), timeout=10)
    assert call.end_reason == "idle_timeout"
    await pc.close()


class CloseFailingEcho(EchoPlugin):
    """An echo whose plugin session raises when it is closed."""

    def close_session(self, session: PluginSession) -> None:
        super().close_session(session)
        raise RuntimeError("close_session failed")


async def test_a_plugin_failing_to_close_still_frees_the_call(start_agent: AgentFactory) -> None:
    running = await start_agent(CloseFailingEcho())
    report, _, _ = await run_call(running.url, seconds=1.0)
    assert report.ok
    await wait_until(lambda: all_freed(running))
    assert running.agent.health()["active_calls"] == 0
