"""`GET /v1/realtime?call_id=ID`: the sideband websocket of WebRTC, media-stream and RTP calls,
driven by real clients on loopback (an aiortc caller, a media-stream bridge, a UDP RTP peer)
and watched by aiohttp websocket clients: session.created at connect, DTMF, transcripts, a
session.update round trip, coded errors, two sidebands on one call, call.ending and the
normal close, another tenant's 404, and a sideband that reaches the call's worker through the
other one (--workers 2); and an auto-accepted SIP call's sideband."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from aiortc import RTCSessionDescription
from aiortc.rtp import RtpPacket

from agent.leg import Leg
from agent.media_agent import AgentSettings, MediaAgent
from agent.realtime.events import server_event
from agent.realtime.sideband import QUEUE_LIMIT
from agent.telephony.codec import PCMU
from agent.telephony.telephone_event import telephone_event_payload
from agent.worker_tag import ID_TOKEN_CHARS, worker_of
from signaling.app import create_app
from signaling.auth import AuthSettings
from signaling.sideband import CLOSE_OVERFLOW
from signaling.sip.config import SipConfig
from signaling.sip.sdp import SessionDescription, parse_sdp
from signaling.sip.service import install as install_sip
from tests.sip.helpers import Dialogue, RtpProbe, SipPeer, sdp_offer
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.keypad_plugin import KeypadEchoPlugin
from tests.support.realtime import RealtimeClient
from tests.support.server_process import running_server
from tests.support.text_echo_plugin import TextEchoPlugin
from tests.workers.test_workers import wait_for_async

SIDEBAND = "/v1/realtime"
MEDIA_STREAM = "/v1/telephony/media-stream"
RTP = "/v1/telephony/rtp"
OWNER_KEY, OTHER_KEY = "key-owner", "key-other"
KEYS = AuthSettings(api_keys=(OWNER_KEY, OTHER_KEY))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Sideband:
    """A websocket client of one call's sideband, collecting what it is sent."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.events: list[dict[str, Any]] = []
        self.close_code: int | None = None
        self._changed = asyncio.Condition()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            if message.type == aiohttp.WSMsgType.TEXT:
                self.events.append(json.loads(message.data))
                async with self._changed:
                    self._changed.notify_all()
        self.close_code = self.socket.close_code

    async def wait_event(self, event_type: str, after: int = 0, timeout: float = 10.0,
                         **fields: Any) -> dict[str, Any]:
        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for event in self.events[after:]:
                        if event.get("type") == event_type and all(
                                event.get(key) == value for key, value in fields.items()):
                            return event
                    await self._changed.wait()
        return await asyncio.wait_for(find(), timeout)

    async def send(self, event: dict[str, Any] | str) -> int:
        mark = len(self.events)
        await self.socket.send_str(event if isinstance(event, str) else json.dumps(event))
        return mark

    async def closed(self, timeout: float = 10.0) -> int | None:
        await asyncio.wait_for(self._reader, timeout)
        return self.close_code

    def types(self) -> list[str]:
        return [event["type"] for event in self.events]

    async def close(self) -> None:
        await self.socket.close()
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)


async def open_sideband(http: aiohttp.ClientSession, base: str, call_id: str,
                        key: str | None = None) -> Sideband:
    socket = await http.ws_connect(f"{base}{SIDEBAND}?call_id={call_id}",
                                   headers=bearer(key) if key else {})
    return Sideband(socket)


async def upgrade_refusal(http: aiohttp.ClientSession, base: str, query: str,
                          headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """A websocket upgrade request as a plain GET: the status and JSON error of a refusal."""
    async with http.get(f"{base}{SIDEBAND}{query}", headers={
            **headers, "Upgrade": "websocket", "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode()}) as response:
        return response.status, await response.json()


def media_stream_start(stream_sid: str = "MZ1") -> dict[str, Any]:
    return {"event": "start", "streamSid": stream_sid, "start": {
        "streamSid": stream_sid, "callSid": "CA1", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {}}}


async def media_stream_call(http: aiohttp.ClientSession, running: RunningAgent,
                            ) -> tuple[aiohttp.ClientWebSocketResponse, Leg]:
    """A media-stream call, as its bridge starts one: the bridge's websocket and the call's
    leg once it holds a plugin seat."""
    bridge = await http.ws_connect(running.url + MEDIA_STREAM, headers=bearer(OWNER_KEY))
    await bridge.send_str(json.dumps(media_stream_start()))
    await wait_until(lambda: any(leg.slot for leg in running.agent.telephony_legs.values()))
    (leg,) = running.agent.telephony_legs.values()
    return bridge, leg


def ulaw_silence_event(stream_sid: str = "MZ1") -> dict[str, Any]:
    payload = base64.b64encode(bytes([0xFF]) * 160).decode()
    return {"event": "media", "streamSid": stream_sid, "media": {"payload": payload}}


async def test_media_stream_call_sideband(start_agent: AgentFactory) -> None:
    """Two sidebands on a media-stream call: greeting, DTMF, transcripts, session.update,
    coded errors on the sender's sideband only, and call.ending with a normal close."""
    running = await start_agent(TextEchoPlugin(), auth=KEYS)
    async with aiohttp.ClientSession() as http:
        bridge, leg = await media_stream_call(http, running)
        first = await open_sideband(http, running.url, leg.id, OWNER_KEY)
        second = await open_sideband(http, running.url, leg.id, OWNER_KEY)
        for sideband in (first, second):
            created = await sideband.wait_event("session.created")
            assert created["session"]["id"] == leg.id
            assert created["session"]["voice"] == "Alpha.pt"
        # DTMF from the bridge reaches both.
        await bridge.send_str(json.dumps({"event": "dtmf", "streamSid": "MZ1",
                                          "dtmf": {"digit": "7"}}))
        for sideband in (first, second):
            await sideband.wait_event("input_audio_buffer.dtmf_event_received", event="7")
        # The agent's answers become transcript events (the hub speaks for this leg).
        for _ in range(10):
            await bridge.send_str(json.dumps(ulaw_silence_event()))
        await first.wait_event("response.output_audio_transcript.delta")
        # A session.update from one sideband: session.updated on both.
        mark = await first.send({"type": "session.update", "event_id": "up1",
                                 "session": {"instructions": "Be brief."}})
        updated = await first.wait_event("session.updated", after=mark)
        assert updated["session"]["instructions"] == "Be brief."
        await second.wait_event("session.updated")
        assert leg.session_config.instructions == "Be brief."
        # Refused changes and bad events: an `error` on the sender's sideband only.
        codes = []
        for event in (
            {"type": "session.update", "event_id": "v1", "session": {"voice": "Bravo.pt"}},
            {"type": "conversation.item.create", "event_id": "u1"},
            "not json",
            {"type": "session.update", "event_id": "s1", "session": "x"},
        ):
            mark = await first.send(event)
            codes.append((await first.wait_event("error", after=mark))["error"])
        assert [c["code"] for c in codes] == ["voice_update_unsupported", "unknown_event",
                                             "invalid_json", "invalid_type"]
        assert [c["event_id"] for c in codes] == ["v1", "u1", None, "s1"]
        assert "error" not in second.types()
        mark = await first.send({"type": "output_audio_buffer.clear"})
        await first.wait_event("output_audio_buffer.cleared", after=mark)
        assert not leg.closing  # nothing a sideband sent ended the call
        # The bridge hangs up: call.ending with the reason, then a normal close.
        await bridge.send_str(json.dumps({"event": "stop", "streamSid": "MZ1"}))
        for sideband in (first, second):
            ending = await sideband.wait_event("call.ending")
            assert ending["reason"] == "stop"
            assert await sideband.closed() == 1000
            assert sideband.types()[-1] == "call.ending"
        await bridge.close()
    await wait_until(lambda: not running.agent.legs and not running.agent.ticker.slots)


async def test_refusals_before_the_upgrade(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=KEYS)
    async with aiohttp.ClientSession() as http:
        bridge = await http.ws_connect(running.url + MEDIA_STREAM, headers=bearer(OWNER_KEY))
        await bridge.send_str(json.dumps(media_stream_start()))
        await wait_until(lambda: bool(running.agent.telephony_legs))
        (call_id,) = running.agent.telephony_legs
        cases = [
            (f"?call_id={call_id}", bearer(OTHER_KEY), 404, "call_not_found"),
            ("?call_id=call_unknown", bearer(OWNER_KEY), 404, "call_not_found"),
            (f"?call_id={call_id}", {}, 401, "missing_api_key"),
            (f"?call_id={call_id}", bearer("wrong"), 401, "invalid_api_key"),
            ("", bearer(OWNER_KEY), 400, "missing_call_id"),
        ]
        async with http.post(running.url + "/v1/realtime/client_secrets", json={},
                             headers=bearer(OWNER_KEY)) as response:
            secret = (await response.json())["value"]
        # An ephemeral secret is the browser's: it makes and manages its call, nothing more.
        cases.append((f"?call_id={call_id}", bearer(secret), 403, "secret_not_allowed"))
        for query, headers, status, code in cases:
            got_status, body = await upgrade_refusal(http, running.url, query, headers)
            assert (got_status, body["error"]["code"]) == (status, code), query
        async with http.get(f"{running.url}{SIDEBAND}?call_id={call_id}",
                            headers=bearer(OWNER_KEY)) as response:  # no upgrade
            assert response.status == 426
            assert (await response.json())["error"]["code"] == "websocket_required"
        assert not running.agent.telephony_legs[call_id].closing
        await bridge.close()


async def test_webrtc_call_sideband(start_agent: AgentFactory,
                                    realtime_clients: list[RealtimeClient]) -> None:
    """A WebRTC call's sideband shares the call's protocol: an update from the sideband shows
    on the data channel too; a hang-up ends the sideband with call.ending and 1000."""
    running = await start_agent(TextEchoPlugin(), auth=KEYS)
    client = RealtimeClient(running.url, token=OWNER_KEY, seconds=20)
    realtime_clients.append(client)
    await client.call()
    async with aiohttp.ClientSession() as http:
        sideband = await open_sideband(http, running.url, client.call_id, OWNER_KEY)
        created = await sideband.wait_event("session.created")
        assert created["session"]["id"] == client.call_id
        await sideband.wait_event("response.output_audio_transcript.delta")
        mark = len(client.events)
        await sideband.send({"type": "session.update", "session": {"instructions": "Hi."}})
        await sideband.wait_event("session.updated")
        channel_update = await client.wait_event("session.updated", after=mark)
        assert channel_update["session"]["instructions"] == "Hi."
        async with http.delete(f"{running.url}{client.location}",
                               headers=bearer(OWNER_KEY)) as response:
            assert response.status == 200
        ending = await sideband.wait_event("call.ending")
        assert ending["reason"] == "hangup"
        assert await sideband.closed() == 1000


def key_press(digit: str, timestamp: int, first_sequence: int) -> list[bytes]:
    """One RFC 4733 key press: three updates, then the end packet three times."""
    payloads = [telephone_event_payload(digit, end=False, duration=160 * (n + 1))
                for n in range(3)]
    payloads += [telephone_event_payload(digit, end=True, duration=640)] * 3
    return [RtpPacket(payload_type=101, marker=int(n == 0), sequence_number=first_sequence + n,
                      timestamp=timestamp, ssrc=0x1234, payload=payload).serialize()
            for n, payload in enumerate(payloads)]


class Peer(asyncio.DatagramProtocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport


async def test_rtp_leg_sideband_sees_rfc4733_digits(start_agent: AgentFactory) -> None:
    plugin = KeypadEchoPlugin()
    running = await start_agent(plugin, auth=KEYS)
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        Peer, local_addr=("127.0.0.1", 0))
    try:
        host, port = transport.get_extra_info("sockname")[:2]
        async with aiohttp.ClientSession() as http:
            async with http.post(running.url + RTP, json={"remote": f"{host}:{port}"},
                                 headers=bearer(OWNER_KEY)) as response:
                body = await response.json()
                assert response.status == 201, body
            sideband = await open_sideband(http, running.url, body["call_id"], OWNER_KEY)
            await sideband.wait_event("session.created")
            local_host, local_port = body["local"].rsplit(":", 1)
            destination = (local_host, int(local_port))
            silence = PCMU.encode(np.zeros(160, np.int16))
            packets = [RtpPacket(payload_type=0, sequence_number=n, timestamp=160 * n,
                                 ssrc=0x1234, payload=silence).serialize() for n in range(5)]
            packets += key_press("9", 800, 5)
            for packet in packets:
                transport.sendto(packet, destination)
                await asyncio.sleep(0.02)
            dtmf = await sideband.wait_event("input_audio_buffer.dtmf_event_received")
            assert dtmf["event"] == "9"
            async with http.delete(f"{running.url}{RTP}/{body['call_id']}",
                                   headers=bearer(OWNER_KEY)) as response:
                assert response.status == 200
            assert (await sideband.wait_event("call.ending"))["reason"] == "hangup"
            assert await sideband.closed() == 1000
        assert plugin.digits == ["9"]
    finally:
        transport.close()


async def test_a_sideband_that_falls_behind_is_closed_and_the_call_goes_on(
        start_agent: AgentFactory) -> None:
    """A burst of events no socket can be written as fast as they come: the websocket
    sideband is closed with its code; an observer with room, the call and later sidebands go
    on."""
    running = await start_agent(auth=KEYS)
    async with aiohttp.ClientSession() as http:
        bridge, leg = await media_stream_call(http, running)
        dropped = await open_sideband(http, running.url, leg.id, OWNER_KEY)
        await dropped.wait_event("session.created")
        roomy = leg.sidebands.attach(limit=4 * QUEUE_LIMIT)
        for _ in range(QUEUE_LIMIT + 1):  # all at once: the socket's writer never runs between
            leg.emit(server_event("input_audio_buffer.dtmf_event_received", event="1"))
        assert await dropped.closed() == CLOSE_OVERFLOW
        assert roomy.finished is None and not leg.closing
        assert leg.sidebands.overflows == 1
        later = await open_sideband(http, running.url, leg.id, OWNER_KEY)
        await later.wait_event("session.created")
        await bridge.send_str(json.dumps({"event": "dtmf", "streamSid": "MZ1",
                                          "dtmf": {"digit": "4"}}))
        await later.wait_event("input_audio_buffer.dtmf_event_received", event="4")
        await bridge.close()
        assert (await later.wait_event("call.ending"))["reason"] == "socket_closed"


@pytest.mark.slow
async def test_a_sideband_reaches_the_call_through_the_other_worker(tmp_path: Path) -> None:
    """--workers 2: a call held by worker 1, its sideband opened on worker 0's socket, is
    relayed to worker 1; another tenant still gets 404; the close code comes through."""
    folder = tmp_path / "workers"
    async with running_server("--workers", "2", "--worker-dir", str(folder), "--api-key",
                              OWNER_KEY, "--api-key", OTHER_KEY) as (_, url, _):
        sessions = {index: aiohttp.ClientSession(connector=aiohttp.UnixConnector(
            path=str(folder / f"worker-{index}.sock"))) for index in (0, 1)}
        call = RealtimeClient("http://worker", token=OWNER_KEY, seconds=20)
        try:
            async def both_up() -> bool:
                for session in sessions.values():
                    async with session.get("http://worker/health") as response:
                        if response.status != 200:
                            return False
                return True
            await wait_for_async(both_up, 60)
            sdp = await call.offer_sdp()
            async with sessions[1].post("http://worker/v1/realtime/calls", data=sdp, headers={
                    "Content-Type": "application/sdp", **bearer(OWNER_KEY)}) as response:
                answer = await response.text()
                assert response.status == 201, answer
                call.location = response.headers["Location"]
            await call.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            await asyncio.wait_for(call.connected.wait(), 20)
            assert worker_of(call.call_id, ID_TOKEN_CHARS) == 1
            status, body = await upgrade_refusal(sessions[0], "http://worker",
                                                 f"?call_id={call.call_id}", bearer(OTHER_KEY))
            assert (status, body["error"]["code"]) == (404, "call_not_found")
            sideband = await open_sideband(sessions[0], "http://worker", call.call_id,
                                           OWNER_KEY)
            created = await sideband.wait_event("session.created", timeout=15)
            assert created["session"]["id"] == call.call_id
            mark = await sideband.send({"type": "session.update",
                                        "session": {"instructions": "Across."}})
            updated = await sideband.wait_event("session.updated", after=mark)
            assert updated["session"]["instructions"] == "Across."
            async with aiohttp.ClientSession() as http:
                async with http.delete(url + call.location,
                                       headers=bearer(OWNER_KEY)) as response:
                    assert response.status == 200
            assert (await sideband.wait_event("call.ending"))["reason"] == "hangup"
            assert await sideband.closed() == 1000
        finally:
            await call.close()
            for session in sessions.values():
                await session.close()


async def test_sip_call_sideband_sees_its_digits_and_its_end() -> None:
    """An auto-accepted SIP call (a hand-made UAC on loopback): its sideband is greeted,
    sees an RFC 4733 key press and the caller's BYE as call.ending."""
    agent = MediaAgent(KeypadEchoPlugin(), AgentSettings())
    app = create_app(agent)
    service = install_sip(app, SipConfig(listen_port=0))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    try:
        assert service.ua is not None
        sip = ("127.0.0.1", service.ua.port)
        dialogue = Dialogue(peer.port, sip)
        invite = dialogue.request("INVITE", body=sdp_offer(probe.port, "0 101"))
        peer.send(invite, sip)
        ok = await peer.response(200)
        peer.send(dialogue.ack_for(invite, ok), sip)
        sdp = parse_sdp(ok.body)
        assert isinstance(sdp, SessionDescription)
        (leg,) = list(agent.legs)
        url = str(server.make_url("")).rstrip("/")
        async with aiohttp.ClientSession() as http:
            sideband = await open_sideband(http, url, leg.id)
            created = await sideband.wait_event("session.created")
            assert created["session"]["id"] == leg.id and leg.transport == "sip"
            for seq, (end, duration) in enumerate([(False, 160), (False, 320), (True, 480)]):
                probe.send(RtpPacket(payload_type=101, sequence_number=seq, timestamp=8000,
                                     ssrc=7, payload=telephone_event_payload(
                                         "#", end=end, duration=duration)),
                           ("127.0.0.1", sdp.media[0].port))
            dtmf = await sideband.wait_event("input_audio_buffer.dtmf_event_received")
            assert dtmf["event"] == "#"
            dialogue.cseq += 1
            peer.send(dialogue.request("BYE"), sip)
            await peer.response(200, method="BYE")
            ending = await sideband.wait_event("call.ending")
            assert ending["reason"] == leg.end_reason
            assert await sideband.closed() == 1000
    finally:
        peer.close()
        probe.close()
        await server.close()
