"""The media-stream websocket, driven by a bridge written here from the protocol facts:
JSON text messages; `connected`, `start`, `media` (base64 μ-law, 160 bytes per 20 ms),
`dtmf`, `mark`, `clear`, `stop` from the bridge; `media`, `mark`, `error` back."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pytest

from agent.media_agent import AgentSettings
from agent.plugins.base import PluginSession, StepOutput
from agent.plugins.echo import EchoPlugin
from agent.telephony.g711 import mulaw_decode, mulaw_encode
from agent.testing.testsignal import band_limited_noise, measure_echo
from signaling.auth import AuthSettings
from signaling.telephony import TelephonyConfig
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.keypad_plugin import KeypadEchoPlugin

PATH = "/v1/telephony/media-stream"
CHUNK = 160  # bytes of μ-law = 20 ms at 8 kHz


def speech_like(seconds: float, rate: int = 8000, seed: int = 3) -> np.ndarray:
    """Band-limited noise shaped into 4 Hz "syllables" with pauses, int16."""
    count = int(seconds * rate)
    noise = band_limited_noise(count, rate, 200, 3400, seed)
    t = np.arange(count) / rate
    envelope = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.5
    envelope *= (np.sin(2 * np.pi * 0.7 * t) > -0.6)  # a pause now and then
    signal = noise * envelope
    signal *= 0.3 / (np.sqrt(np.mean(signal**2)) + 1e-12)
    return (np.clip(signal, -1, 1) * 32767).astype(np.int16)


@dataclass
class Bridge:
    """A media-stream bridge: sends a call's audio, records what the agent sends back."""

    socket: aiohttp.ClientWebSocketResponse
    stream_sid: str = "MZ00000000000000000000000000000001"
    media: list[bytes] = field(default_factory=list)
    media_arrivals: list[float] = field(default_factory=list)
    marks: list[tuple[str, int]] = field(default_factory=list)  # (name, media count then)
    errors: list[dict[str, Any]] = field(default_factory=list)
    others: list[dict[str, Any]] = field(default_factory=list)
    _reader: asyncio.Task[None] | None = None

    def start_reading(self) -> None:
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            event = json.loads(message.data)
            kind = event.get("event")
            if kind == "media":
                assert event["streamSid"] == self.stream_sid
                self.media.append(base64.b64decode(event["media"]["payload"]))
                self.media_arrivals.append(time.monotonic())
            elif kind == "mark":
                self.marks.append((event["mark"]["name"], len(self.media)))
            elif kind == "error":
                self.errors.append(event)
            else:
                self.others.append(event)

    async def finished(self, timeout: float = 10.0) -> None:
        assert self._reader is not None
        await asyncio.wait_for(self._reader, timeout)

    async def send(self, event: dict[str, Any]) -> None:
        await self.socket.send_str(json.dumps(event))

    async def open(self, parameters: dict[str, str] | None = None) -> None:
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self.send({
            "event": "start", "sequenceNumber": "1", "streamSid": self.stream_sid,
            "start": {
                "streamSid": self.stream_sid, "accountSid": "AC1", "callSid": "CA1",
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": parameters or {},
            },
        })

    async def mark(self, name: str) -> None:
        await self.send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    def media_event(self, payload: bytes, chunk: int) -> dict[str, Any]:
        return {
            "event": "media", "sequenceNumber": str(chunk + 2), "streamSid": self.stream_sid,
            "media": {"track": "inbound", "chunk": str(chunk + 1), "timestamp": str(chunk * 20),
                      "payload": base64.b64encode(payload).decode("ascii")},
        }

    async def stream(self, ulaw: bytes, extra: dict[int, Sequence[Any]] | None = None) -> None:
        """Send `ulaw` in real time, 20 ms per message; `extra[i]` goes out after chunk i."""
        started = time.monotonic()
        for index in range(len(ulaw) // CHUNK):
            await self.send(self.media_event(ulaw[index * CHUNK:(index + 1) * CHUNK], index))
            for message in (extra or {}).get(index, ()):
                if isinstance(message, str):
                    await self.socket.send_str(message)
                elif isinstance(message, bytes):
                    await self.socket.send_bytes(message)
                else:
                    await self.send(message)
            await asyncio.sleep(max(0.0, started + (index + 1) * 0.02 - time.monotonic()))

    def pcm(self) -> np.ndarray:
        return mulaw_decode(b"".join(self.media))

    def loud_chunks(self, threshold: float = 4000.0) -> list[bool]:
        return [float(np.sqrt(np.mean(mulaw_decode(chunk).astype(np.float64) ** 2))) > threshold
                for chunk in self.media]


async def connect(http: aiohttp.ClientSession, running: RunningAgent, path: str = PATH,
                  **kwargs: Any) -> Bridge:
    socket = await http.ws_connect(running.url + path, **kwargs)
    bridge = Bridge(socket)
    bridge.start_reading()
    return bridge


MALFORMED: list[Any] = [
    "not json", "[1, 2]", "42", json.dumps({"no": "event"}), json.dumps({"event": 7}),
    json.dumps({"event": "bogus"}), json.dumps({"event": "media"}),
    json.dumps({"event": "media", "media": {"payload": 5}}),
    json.dumps({"event": "media", "media": {"payload": "***not base64***"}}),
    json.dumps({"event": "media", "media": "x"}),
    json.dumps({"event": "mark"}), json.dumps({"event": "mark", "mark": {"name": 3}}),
    json.dumps({"event": "dtmf", "dtmf": {"digit": "Z"}}), json.dumps({"event": "dtmf"}),
    json.dumps({"event": "start", "start": {"streamSid": "again"}}),  # already started
    json.dumps({"event": "media", "media": {"payload": "A" * 20000}}),  # far over 1 s
    b"\x00\x01binary", "{", json.dumps({"event": "dtmf", "dtmf": {"digit": "12"}}),
    json.dumps({"event": "mark", "mark": {"name": "n" * 1000}}),
]


@pytest.mark.slow
async def test_stream_echoes_paced_mulaw_through_malformed_messages_and_dtmf(
    start_agent: AgentFactory,
) -> None:
    plugin = KeypadEchoPlugin()
    running = await start_agent(plugin)
    sent = speech_like(5.0)
    extra: dict[int, list[Any]] = {10 + 10 * i: [message] for i, message in enumerate(MALFORMED)}
    bridge_sid = Bridge.stream_sid
    for chunk, digit in ((125, "7"), (126, "#")):
        extra[chunk] = [{"event": "dtmf", "streamSid": bridge_sid,
                         "dtmf": {"track": "inbound_track", "digit": digit}}]
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, running)
        await bridge.open({"voice": "any", "instructions": "be brief"})
        started = time.monotonic()
        await bridge.stream(mulaw_encode(sent), extra)
        await asyncio.sleep(0.5)  # the echo of the last chunks
        elapsed = time.monotonic() - started
        received_by_then = len(bridge.media)
        (session,) = running.agent.telephony_legs.values()
        events = [event["type"] for event in session.events]
        health = running.agent.health()
        stats = session.stats()
        async with http.get(running.url + "/metrics/calls") as response:
            listed = (await response.json())["calls"]
        await bridge.send({"event": "stop", "streamSid": bridge.stream_sid})
        await bridge.finished()
    assert len(MALFORMED) == 20
    assert len(bridge.errors) == 20, bridge.errors
    assert all(e["error"]["code"] and e["error"]["message"] for e in bridge.errors)
    assert stats["malformed_messages"] == 20
    # Continuous, paced μ-law back: 160-byte chunks, about one per 20 ms, no burst, no hole.
    assert all(len(chunk) == CHUNK for chunk in bridge.media)
    expected = elapsed / 0.02
    assert 0.8 * expected <= received_by_then <= expected + 5, (received_by_then, expected)
    gaps = np.diff(bridge.media_arrivals)
    assert gaps.max() < 0.3, gaps.max()
    echo = measure_echo(sent.astype(np.float32) / 32768, bridge.pcm().astype(np.float32) / 32768,
                        8000)
    assert echo.correlation >= 0.7, echo
    # DTMF: session events and the plugin's hook, in order.
    assert events.count("input_audio_buffer.dtmf_event_received") == 2
    assert [e["event"] for e in session.events
            if e["type"] == "input_audio_buffer.dtmf_event_received"] == ["7", "#"]
    assert plugin.digits == ["7", "#"]
    assert health["active_calls"] == 1 and health["legs"]["media-stream"] == 1
    assert [(c["kind"], c["stream_sid"]) for c in listed] == [("media_stream", bridge.stream_sid)]
    await wait_until(lambda: not running.agent.telephony_legs and not running.agent.ticker.slots)
    assert session.end_reason == "stop"


class BurstPlugin(EchoPlugin):
    """Speaks 1.5 s of tone at once on its first step (more than a frame), then echoes."""

    id = "burst"
    BURST_SECONDS = 1.5

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        outputs = super().step(batch)
        for (session, _), output in zip(batch, outputs, strict=False):
            if not getattr(session, "burst_done", False):
                session.burst_done = True  # type: ignore[attr-defined]
                t = np.arange(int(self.BURST_SECONDS * 24000)) / 24000
                output.audio = (0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)
        return outputs


async def _stream_silence(bridge: Bridge, seconds: float) -> None:
    await bridge.stream(mulaw_encode(np.zeros(int(seconds * 8000), np.int16)))


async def bridge_hearing_the_burst(http: aiohttp.ClientSession, running: RunningAgent,
                                   seconds: float) -> tuple[Bridge, asyncio.Future[None]]:
    """A bridge streaming `seconds` of silence (the sending task), once the tone arrives."""
    bridge = await connect(http, running)
    await bridge.open()
    sender = asyncio.ensure_future(_stream_silence(bridge, seconds))
    await wait_until(lambda: any(bridge.loud_chunks()))
    return bridge, sender


async def test_marks_come_back_in_order_after_their_audio(start_agent: AgentFactory) -> None:
    running = await start_agent(BurstPlugin())
    async with aiohttp.ClientSession() as http:
        bridge, sender = await bridge_hearing_the_burst(http, running, 3.0)
        for name in ("first", "second", "third"):
            await bridge.mark(name)
        await sender
        await wait_until(lambda: len(bridge.marks) == 3)
        await bridge.socket.close()
    assert [name for name, _ in bridge.marks] == ["first", "second", "third"]
    loud = bridge.loud_chunks()
    tone_chunks = sum(loud)
    assert tone_chunks >= int(BurstPlugin.BURST_SECONDS / 0.02) - 2
    # Each mark came back only once the whole tone queued before it had been sent (give or
    # take the resampler's filter delay, under a millisecond: hence "mostly tone" chunks).
    last_tone = max(i for i, is_loud in enumerate(loud) if is_loud)
    for _, media_count in bridge.marks:
        assert media_count > last_tone, (bridge.marks, last_tone, loud)


async def test_clear_drops_queued_agent_audio_and_releases_marks(start_agent: AgentFactory) -> None:
    running = await start_agent(BurstPlugin())
    async with aiohttp.ClientSession() as http:
        bridge, sender = await bridge_hearing_the_burst(http, running, 2.5)
        await bridge.mark("before-clear")
        await bridge.send({"event": "clear", "streamSid": bridge.stream_sid})
        await wait_until(lambda: len(bridge.marks) == 1)
        (session,) = running.agent.telephony_legs.values()
        await sender
        await bridge.socket.close()
    assert bridge.marks[0][0] == "before-clear"
    full_burst = int(BurstPlugin.BURST_SECONDS / 0.02)
    # Without the clear the tone would have lasted 75 chunks; it stopped right away.
    assert sum(bridge.loud_chunks()) < full_burst // 2, sum(bridge.loud_chunks())
    assert session.playout.buffered_samples < 24000 * 0.2
    assert bridge.errors == []


async def test_start_parameters_are_validated_by_the_plugin(echo_agent: RunningAgent) -> None:
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, echo_agent)
        await bridge.open({"extra_body": json.dumps({"delay_frames": "soon"})})
        await bridge.finished()
        assert bridge.socket.close_code == 1008
    assert [e["error"]["code"] for e in bridge.errors] == ["invalid_option"]
    await wait_until(lambda: not echo_agent.agent.telephony_legs
                     and not echo_agent.agent.ticker.slots)


async def test_extra_body_parameter_reaches_the_plugin(echo_agent: RunningAgent) -> None:
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, echo_agent)
        await bridge.open({"voice": "v1", "persona": "a helpful agent",
                           "extra_body": json.dumps({"delay_frames": 2})})
        await wait_until(lambda: any(s.slot for s in echo_agent.agent.telephony_legs.values()))
        (session,) = echo_agent.agent.telephony_legs.values()
        config = session.slot.config
        await bridge.socket.close()
    assert (config.voice, config.instructions, dict(config.options)) == (
        "v1", "a helpful agent", {"delay_frames": 2})


async def test_admission_limit_is_shared_and_503_before_upgrade(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(max_calls=1))
    async with aiohttp.ClientSession() as http:
        first = await connect(http, running)
        await first.open()
        await wait_until(lambda: len(running.agent.telephony_legs) == 1)
        async with http.get(running.url + PATH, headers={
            "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode(),
        }) as response:
            assert response.status == 503
            assert (await response.json())["error"]["code"] == "server_full"
            assert response.headers.get("Retry-After")
        async with http.post(running.url + "/v1/telephony/rtp", json={"codec": "PCMU"}) as response:
            assert response.status == 503
        await first.socket.close()
    await wait_until(lambda: not running.agent.telephony_legs)
    assert running.agent.health()["active_calls"] == 0


async def test_query_token_authenticates_the_socket(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("sk-telephony",)))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + PATH) as response:
            assert response.status == 401
        async with http.get(running.url + PATH + "?token=wrong") as response:
            assert response.status == 401
        async with http.post(running.url + "/v1/telephony/rtp?token=sk-telephony",
                             json={"codec": "PCMU"}) as response:
            assert response.status == 401  # query tokens are for the websocket only
        bridge = await connect(http, running, PATH + "?token=sk-telephony")
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        await bridge.socket.close()
        bridge = await connect(http, running, headers={"Authorization": "Bearer sk-telephony"})
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        await bridge.socket.close()
        # Twilio's <Stream url> takes no query string: the key can be the last path segment.
        async with http.get(running.url + PATH + "/wrong") as response:
            assert response.status == 401
        bridge = await connect(http, running, PATH + "/sk-telephony")
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        await bridge.socket.close()


async def test_path_is_configurable_and_plain_get_is_refused(start_agent: AgentFactory) -> None:
    running = await start_agent(
        telephony_config=TelephonyConfig(media_stream_path="/twilio/stream"))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/twilio/stream") as response:
            assert response.status == 426
            assert (await response.json())["error"]["code"] == "websocket_required"
        async with http.get(running.url + PATH) as response:
            assert response.status == 404
        bridge = await connect(http, running, "/twilio/stream")
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        await bridge.socket.close()
    await wait_until(lambda: not running.agent.telephony_legs)


async def test_closed_socket_and_shutdown_end_sessions(start_agent: AgentFactory) -> None:
    running = await start_agent()
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, running)
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        (session,) = running.agent.telephony_legs.values()
        await bridge.socket.close()
        await wait_until(lambda: not running.agent.telephony_legs
                         and not running.agent.ticker.slots)
        assert session.end_reason == "socket_closed"

        bridge = await connect(http, running)
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        (session,) = running.agent.telephony_legs.values()
        await running.server.close()
        await bridge.finished()
    assert session.end_reason == "shutdown"
    assert not running.agent.telephony_legs and not running.agent.ticker.slots


async def test_a_socket_that_never_starts_is_ended(start_agent: AgentFactory) -> None:
    from agent.call_settings import CallSettings

    running = await start_agent(settings=AgentSettings(call=CallSettings(connect_timeout=0.5)))
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, running)
        await bridge.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await bridge.finished()
    assert not running.agent.telephony_legs


async def test_dtmf_flood_is_rate_limited_and_the_stream_goes_on(start_agent: AgentFactory) -> None:
    from agent.telephony.leg import DTMF_BURST

    plugin = KeypadEchoPlugin()
    running = await start_agent(plugin)
    async with aiohttp.ClientSession() as http:
        bridge = await connect(http, running)
        await bridge.open()
        for _ in range(200):
            await bridge.send({"event": "dtmf", "streamSid": bridge.stream_sid,
                               "dtmf": {"digit": "5"}})
        await wait_until(lambda: len(plugin.digits) + len(bridge.errors) == 200)
        (session,) = running.agent.telephony_legs.values()
        assert session.closing is False
        assert session.stats()["dtmf_refused"] == len(bridge.errors)
        await _stream_silence(bridge, 0.5)  # media is still taken after the flood
        await bridge.send({"event": "stop", "streamSid": bridge.stream_sid})
        await bridge.finished()
    # The burst (plus what refilled while the flood was read) reached the plugin; the rest
    # were refused with a coded error each, and the socket stayed usable throughout.
    assert DTMF_BURST <= len(plugin.digits) < 200 // 2
    assert {e["error"]["code"] for e in bridge.errors} == {"rate_limited"}
    assert bridge.media


async def test_a_bridge_that_hangs_up_during_the_upgrade_is_no_server_error(
        start_agent: AgentFactory, caplog: Any) -> None:
    """The upgrade request is read, then the connection is reset before the answer: the
    handler finds nobody to answer, which is the caller's doing, not an unhandled error."""
    import logging
    import socket
    import struct

    running = await start_agent()
    host, port = running.url.removeprefix("http://").split(":")
    request = (f"GET {PATH} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n"
               "Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
               f"Sec-WebSocket-Key: {base64.b64encode(b'0123456789abcdef').decode()}\r\n\r\n")
    caplog.set_level(logging.INFO, logger="signaling")

    def hung_up() -> bool:
        return any("hung up before the answer" in r.getMessage() for r in caplog.records)
    for _ in range(20):  # whether the reset beats the request to the server is a race
        _, writer = await asyncio.open_connection(host, int(port))
        raw = writer.get_extra_info("socket")
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.write(request.encode())
        await writer.drain()
        writer.transport.abort()  # SO_LINGER 0: a reset, not a goodbye
        await asyncio.sleep(0.05)
        if hung_up():
            break
    assert hung_up()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    await wait_until(lambda: not running.agent.telephony_legs)
    async with aiohttp.ClientSession() as http:  # and the server goes on
        bridge = await connect(http, running)
        await bridge.open()
        await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
        await bridge.socket.close()
