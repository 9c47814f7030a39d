"""The peer's transports against this agent (the echo plugin, on loopback): every transport
places a call, its echo comes back with the delay measured on the t0 timeline, events arrive
where the protocol has room for them (the data channel, the media-stream marks, the RTP
leg's sideband), key presses go both ways where the transport has a way, and hanging up ends
the call on the server. Bad targets fail with one coded error."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from agent.testing.peer.call import place_call
from agent.testing.peer.measure import echo_delay, measure_into
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports.base import PeerCall, PeerError, PeerOptions, open_call
from agent.testing.peer.transports.narrowband import codec_name
from agent.testing.peer.transports.rtp_stream import RTP_HEADER, RtpStream
from agent.testing.testsignal import make_test_signal
from signaling.app import create_app
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from tests.support.agents import RunningAgent, wait_until


@dataclass
class SipAgent:
    agent: MediaAgent
    uri: str
    url: str  # its HTTP side


@pytest.fixture
async def sip_agent() -> AsyncIterator[SipAgent]:
    """The echo agent answering SIP on 127.0.0.1 (a free UDP port), stopped after the test."""
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    app = create_app(agent)
    service = install(app, SipConfig(listen_port=0))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    assert service.ua is not None
    try:
        yield SipAgent(agent, f"sip:agent@127.0.0.1:{service.ua.port}",
                       str(server.make_url("")).rstrip("/"))
    finally:
        await server.close()

SECONDS = 2.0


def assert_echoed(report: CallReport, call: PeerCall | None) -> None:
    assert report.ok, report
    assert report.delay_ms is not None and 0 < report.delay_ms < 1500, report
    # What came back is the signal: the 250 ms windows after the first second match it. On a
    # loaded machine one stall of the path cuts the echo at one point, and the window holding
    # it (or the two either side of it) stops matching; a path that lost or garbled audio
    # leaves more holes, or windows that match poorly.
    assert call is not None
    echo = echo_delay(call.sent, call.received)
    assert echo is not None and echo.holes == report.holes, report
    assert echo.holes <= 2 and echo.windows > echo.holes and echo.matched > 0.8, (echo, report)
    assert report.first_audio_ms is not None and report.first_audio_ms > 0
    assert report.jitter_ms is not None


@pytest.mark.parametrize("transport", ["webrtc", "realtime", "media-stream", "rtp"])
async def test_every_transport_gets_its_echo_back(echo_agent: RunningAgent,
                                                  transport: str) -> None:
    report, call = await place_call(echo_agent.url, transport, PeerOptions(), seconds=SECONDS)
    assert_echoed(report, call)
    assert report.transport == transport and report.end_reason == "hangup"
    assert call is not None and call.sent.t0 == call.t0 == call.received.t0
    await wait_until(lambda: not echo_agent.agent.legs and not echo_agent.agent.ticker.slots)


@pytest.mark.parametrize("transport", ["webrtc", "realtime", "media-stream", "rtp"])
async def test_a_load_test_call_decodes_after_the_call_and_measures_the_same(
        echo_agent: RunningAgent, transport: str) -> None:
    """`defer_decoding`: audio encoded when queued, the agent's kept as bytes during the call
    and decoded by `finish_recordings` (measure_into), for the same report."""
    options = PeerOptions(extra={"defer_decoding": True})
    report, call = await place_call(echo_agent.url, transport, options, seconds=SECONDS)
    assert_echoed(report, call)
    assert call is not None and call.received.seconds > SECONDS - 0.5
    assert report.first_audio_ms is not None and report.gaps == 0


async def test_a_polled_rtp_socket_keeps_each_packets_kernel_arrival_time() -> None:
    # Load-test mode: the socket is read on the send clock's tick (one epoll for every
    # stream), not on the event loop; a packet's arrival is still when the kernel got it, and
    # it is kept as it came, then parsed and counted after the call.
    call = open_call("rtp://127.0.0.1:9", "rtp", PeerOptions(extra={"defer_decoding": True}))
    stream = RtpStream(call, codec_name(None))
    local = await stream.bind("127.0.0.1")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sender.bind(("127.0.0.1", 0))
        stream.remote = sender.getsockname()
        packet = RTP_HEADER.pack(0x80, stream.payload_type, 1, 160, 7) + stream.encoder.silence
        sent_at = time.monotonic()
        sender.sendto(packet, local)
        await asyncio.sleep(0.1)  # the poller reads it on a tick of the shared send clock
        read_at = time.monotonic()
        assert stream.packets_received == 0 and len(stream._kept) == 1
        arrived = stream._kept[0][0]
        assert sent_at - 0.001 <= arrived < read_at - 0.05
        stream.publish()  # after the call: parsed, counted and decoded with the recordings
        assert stream.packets_received == 0 and call.packets_received is None
        call.finish_recordings()
        assert stream.packets_received == call.packets_received == 1
        assert call.received.arrivals == [arrived]
    finally:
        sender.close()
        await stream.close()


async def test_realtime_events_both_ways_on_the_data_channel(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "realtime", PeerOptions(session={"instructions": "hi"}))
    try:
        await call.connect()
        created = await call.wait_event(lambda e: e["type"] == "session.created", 5.0, since=0)
        assert created is not None and created.t >= 0
        await call.send_event({"type": "session.update",
                               "session": {"type": "realtime", "instructions": "bye"}})
        updated = await call.wait_event(lambda e: e["type"] == "session.updated", 5.0)
        assert updated is not None and updated.t > created.t
        assert call.call_id in echo_agent.agent.webrtc_legs
        with pytest.raises(PeerError) as no_dtmf:
            await call.send_dtmf("1")
        assert no_dtmf.value.code == "unsupported"
        await call.hangup()
    finally:
        await call.close()
    assert call.end_reason == "hangup"
    await wait_until(lambda: not echo_agent.agent.webrtc_legs)


async def test_a_call_ended_by_the_server_is_reported_as_such(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "realtime", PeerOptions(extra={"media_timeout": 1.0}))
    try:
        await call.connect()
        async with aiohttp.ClientSession() as http, http.post(
                f"{echo_agent.url}/v1/realtime/calls/{call.call_id}/hangup") as response:
            assert response.status == 200
        await asyncio.wait_for(call.ended.wait(), 10)
    finally:
        await call.close()
    # aiortc does not see the server's peer connection close; the agent's audio stopping does
    assert call.end_reason in ("remote_hangup", "media_timeout")


async def test_media_stream_marks_come_back_after_the_audio(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "media-stream", PeerOptions())
    try:
        await call.connect()
        call.play(make_test_signal(0.5))
        await call.send_event({"event": "mark", "mark": {"name": "after-signal"}})
        mark = await call.wait_event(
            lambda e: e["type"] == "media_stream.mark" and e["mark"]["name"] == "after-signal",
            5.0)
        assert mark is not None
        await call.send_dtmf("5")
        await call.send_event({"event": "mark", "mark": {"name": 7}})  # the agent refuses it
        error = await call.wait_event(lambda e: e["type"] == "error", 5.0)
        assert error is not None and error.event["error"]["code"] == "invalid_mark"
        await call.hangup()
    finally:
        await call.close()
    await wait_until(lambda: not echo_agent.agent.legs)


async def test_rtp_dtmf_both_ways_and_events_on_the_sideband(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "rtp", PeerOptions(sideband=True))
    try:
        await call.connect()
        assert await call.wait_event(lambda e: e["type"] == "session.created", 5.0, since=0)
        await call.send_dtmf("4#")
        pressed = await call.wait_event(
            lambda e: e["type"] == "input_audio_buffer.dtmf_event_received"
            and e["event"] == "#", 5.0, since=0)
        assert pressed is not None
        async with aiohttp.ClientSession() as http, http.post(
                f"{echo_agent.url}/v1/realtime/calls/{call.call_id}/dtmf",
                json={"digits": "19"}) as response:
            assert response.status == 200, await response.text()
        await wait_until(lambda: len(call.dtmf_received) == 2, 5.0)
        await call.hangup()
    finally:
        await call.close()
    report = measure_into(CallReport(), call)
    assert report.dtmf_received == ["1", "9"]
    assert report.packets_received and report.packets_lost == 0
    assert "call.ending" in report.events
    await wait_until(lambda: not echo_agent.agent.legs)


def closed_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("transport,url,code", [
    ("webrtc", "http://127.0.0.1:{port}", "connect_failed"),
    ("realtime", "http://127.0.0.1:{port}", "connect_failed"),
    ("media-stream", "http://127.0.0.1:{port}", "connect_failed"),
    ("rtp", "http://127.0.0.1:{port}", "connect_failed"),
    ("rtp", "ftp://127.0.0.1:{port}", "bad_url"),
    ("sip", "http://127.0.0.1:{port}", "bad_url"),
    ("sip", "sip:agent@127.0.0.1:{port};transport=tcp", "unsupported"),
    ("media-stream", "http://127.0.0.1:{port}", "unsupported"),  # with codec opus
])
async def test_bad_targets_fail_with_one_coded_error(transport: str, url: str,
                                                     code: str) -> None:
    options = PeerOptions(timeout=3.0, codec="opus" if code == "unsupported" and
                          transport == "media-stream" else None)
    report, _ = await place_call(url.format(port=closed_tcp_port()), transport, options,
                                 seconds=1.0)
    assert report.error_code == code, report
    assert report.error and "\n" not in report.error
    assert not report.ok and not report.connected


async def test_refusals_of_the_agent_are_reported_with_its_answer(
        echo_agent: RunningAgent) -> None:
    bad_session = PeerOptions(session={"voice": 42})
    for transport in ("webrtc", "realtime", "rtp"):
        report, _ = await place_call(echo_agent.url, transport, bad_session, seconds=1.0)
        assert report.error_code == "refused", (transport, report)
        assert "400" in (report.error or ""), report
    report, _ = await place_call(echo_agent.url + "/v1/telephony/media-stream-typo",
                                 "media-stream", PeerOptions(), seconds=1.0)
    assert report.error_code == "refused" and "404" in (report.error or "")


@pytest.fixture
async def silent_udp_port() -> AsyncIterator[int]:
    """A UDP port that takes datagrams and never answers: a SIP server that is not there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        yield int(sink.getsockname()[1])


async def test_a_sip_server_that_never_answers_times_out(silent_udp_port: int) -> None:
    report, _ = await place_call(f"sip:agent@127.0.0.1:{silent_udp_port}", "sip",
                                 PeerOptions(timeout=1.5), seconds=1.0)
    assert report.error_code == "timeout" and "INVITE" in (report.error or "")



@pytest.mark.parametrize("load_test", [False, True], ids=["live", "load-test"])
async def test_sip_call_to_the_agent_echoes_and_hangs_up_with_bye(sip_agent: SipAgent,
                                                                  load_test: bool) -> None:
    # load-test: the RTP socket polled on the send tick, the audio decoded after the call.
    options = PeerOptions(extra={"defer_decoding": True} if load_test else {})
    report, call = await place_call(sip_agent.uri, "sip", options, seconds=SECONDS)
    assert_echoed(report, call)
    assert report.packets_lost == 0 and report.packets_received
    assert call is not None and call.received.seconds > SECONDS - 0.5
    assert "sip.provisional" in report.events  # 100 Trying before the 200
    await wait_until(lambda: not sip_agent.agent.legs and not sip_agent.agent.ticker.slots)


async def test_sip_dtmf_reaches_the_agent(sip_agent: SipAgent) -> None:
    """Seen where an application would see it: on the call's sideband websocket."""
    call = open_call(sip_agent.uri, "sip", PeerOptions())
    try:
        await call.connect()
        await wait_until(lambda: bool(sip_agent.agent.legs))
        leg_id = next(iter(sip_agent.agent.legs)).id
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{sip_agent.url}/v1/realtime?call_id={leg_id}") as sideband:
            await call.send_dtmf("7*")
            digits: list[str] = []
            while len(digits) < 2:
                event = await asyncio.wait_for(sideband.receive_json(), 5.0)
                if event["type"] == "input_audio_buffer.dtmf_event_received":
                    digits.append(event["event"])
        assert digits == ["7", "*"]
        await call.hangup()
    finally:
        await call.close()


async def test_sip_bye_from_the_agent_ends_the_call(sip_agent: SipAgent) -> None:
    call = open_call(sip_agent.uri, "sip", PeerOptions())
    try:
        await call.connect()
        await wait_until(lambda: bool(sip_agent.agent.legs))
        leg = next(iter(sip_agent.agent.legs))
        await leg.close("hangup")  # the agent ends the call: its UA sends BYE
        await asyncio.wait_for(call.ended.wait(), 10)
        bye = await call.wait_event(lambda e: e["type"] == "sip.bye", 1.0, since=0)
    finally:
        await call.close()
    assert call.end_reason == "remote_hangup" and bye is not None


async def test_a_media_stream_the_agent_closes_ends_the_call(echo_agent: RunningAgent) -> None:
    call = open_call(echo_agent.url, "media-stream", PeerOptions())
    try:
        await call.connect()
        await wait_until(lambda: bool(echo_agent.agent.legs))
        await next(iter(echo_agent.agent.legs)).close("hangup")
        await asyncio.wait_for(call.ended.wait(), 10)
    finally:
        await call.close()
    assert call.end_reason == "remote_hangup"
