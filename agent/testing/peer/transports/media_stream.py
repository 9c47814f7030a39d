"""The media-stream transport of the headless peer: a Twilio-style websocket, as a phone
bridge speaks it to the agent.

The peer plays the bridge: it opens the websocket (a base URL gets the agent's default path,
`/v1/telephony/media-stream`; `ws://`/`wss://` URLs are used as given; the token goes as the
Bearer header), sends `connected` and `start` (a stream id, μ-law or A-law at 8 kHz, the
session's voice / instructions / extra_body as custom parameters), then one `media` message of
160 bytes every 20 ms (audio encoded when queued), `dtmf` for key presses, `mark` when asked
(`send_event` with `{"event": "mark", ...}` or any other media-stream message) and `stop` to
hang up. From the
agent it takes `media` (the agent's audio), `mark` and `error`; each message other than media
becomes an event on the call's timeline as `{"type": "media_stream.<event>", ...}` (an
`error` also as `{"type": "error", "error": {...}}`, the shape every transport reports).
This protocol has no room for the agent's other events, nor does it tell the bridge the
agent's call id, so the sideband (sideband.py) is opened only for a call id given in
`PeerOptions.extra["sideband_call_id"]`.

What a call costs the peer (a load test should measure the agent, not its callers): the
`media` messages of every call of the process go out on one shared 20 ms tick (send_tick.py;
each call its own `Pacer`), each a template's bytes filled with the chunk number and a
payload's base64 (encoded when the audio was queued), written by driving aiohttp's send
coroutine in place (inline_send.py) rather than from a task per call; in a load test by
aiohttp's frame writer itself (a private method, checked for when connecting; `send_str`
where it is not there).
With `extra["defer_decoding"]` (a load test without a script: nothing reads the agent's
audio during the call) the agent's `media` messages are kept as text with their arrival
times and parsed and decoded after the call (`PeerCall.finish_recordings`): they are taken
off the websocket as they arrive (websocket_tap.py), not through a receive loop woken for
each, and the connection is read on the shared tick with every call's (receive_poll.py, every
5 ms for a second after a burst) with the kernel's arrival times, not on a wake-up of the
event loop per message. The agent's first
message of another kind (a mark, an error, `stop`, the close) hands the call over to the
ordinary receive loop, so events are on the timeline when they arrive and an agent that
closes the websocket ends the call with `remote_hangup`, as without a load test.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import inspect
import json
import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse, urlunparse

import aiohttp
import numpy as np

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME
from agent.testing.peer.transports.base import (
    BAD_URL,
    CLOSED,
    CONNECT_FAILED,
    REFUSED,
    TIMEOUT,
    UNSUPPORTED,
    EncodedPlayback,
    PeerCall,
    PeerError,
    PeerOptions,
    TimedEvent,
)
from agent.testing.peer.transports.inline_send import InlineSend
from agent.testing.peer.transports.narrowband import NarrowbandCodec, codec_name
from agent.testing.peer.transports.receive_poll import PolledConnection, receive_poll
from agent.testing.peer.transports.send_tick import send_tick
from agent.testing.peer.transports.sideband import Sideband
from agent.testing.peer.transports.urls import url_problem
from agent.testing.peer.transports.websocket_tap import WebsocketTap

DEFAULT_PATH = "/v1/telephony/media-stream"
ENCODINGS = {"PCMU": "audio/x-mulaw", "PCMA": "audio/x-alaw"}
DTMF_DIGITS = "0123456789*#ABCD"
# Bytes the connection may hold unsent before the media sends wait for it to drain (aiohttp's
# writer waits past the same 64 KiB).
SEND_BUFFER_LIMIT = 64 * 1024
# How a media message starts as json.dumps writes it (the agent's) or compact: kept as text
# in a load test and parsed after the call; any other message is parsed when it comes.
MEDIA_PREFIXES = ('{"event": "media",', '{"event":"media",')


def websocket_url(url: str) -> str:
    problem = url_problem(url, "media-stream")
    if problem is not None:
        raise PeerError(BAD_URL, problem)
    parsed = urlparse(url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}[parsed.scheme.lower()]
    path = parsed.path if parsed.path.rstrip("/") else DEFAULT_PATH
    return urlunparse((scheme, parsed.netloc, path, "", parsed.query, ""))


class MediaTemplate:
    """A call's `media` messages without a dict and json.dumps each: the bytes json.dumps
    writes for `{"event": "media", "streamSid": ..., "media": {"track": "inbound", "chunk":
    ..., "payload": ...}}` (the stream id and base64 need no escaping), filled in with the
    chunk number and the payload's base64 (made once per payload: `media_payloads`)."""

    def __init__(self, stream_sid: str) -> None:
        if not stream_sid.isalnum():
            raise ValueError("a stream id of letters and digits only")
        self._head = ('{"event": "media", "streamSid": "' + stream_sid
                      + '", "media": {"track": "inbound", "chunk": "').encode()

    def fill(self, chunk: int, payload_base64: bytes) -> bytes:
        return (self._head + str(chunk).encode() + b'", "payload": "' + payload_base64
                + b'"}}')


def media_payloads(encoder: NarrowbandCodec) -> Callable[[np.ndarray], list[bytes]]:
    """The playback's encoding for this transport: each 20 ms payload in the base64 that the
    `media` message carries, encoded once when queued (and shared by the calls of a run)."""

    def encode(samples: np.ndarray) -> list[bytes]:
        return [base64.b64encode(payload) for payload in encoder.encode_packets(samples)]

    return encode


FrameWrite = Callable[[bytes, int, int], None]


def aiohttp_frame_writer(socket: Any) -> tuple[FrameWrite, asyncio.WriteTransport] | None:
    """aiohttp's own frame writer of a client websocket (framing and masking, no coroutine
    around it) and the transport it writes to; None where they are not as expected (another
    aiohttp version, compression): the sends then go through `send_str`."""
    writer = getattr(socket, "_writer", None)
    write: Any = getattr(writer, "_write_websocket_frame", None)
    transport: Any = getattr(writer, "transport", None)
    if (not callable(write) or getattr(writer, "compress", None)
            or not callable(getattr(transport, "get_write_buffer_size", None))):
        return None
    try:
        names = list(inspect.signature(write).parameters)
    except (TypeError, ValueError):
        return None
    return (write, transport) if names == ["message", "opcode", "rsv"] else None


def custom_parameters(session: dict[str, Any] | None) -> dict[str, str]:
    """The session config as a bridge passes it: strings only (extra_body as JSON)."""
    parameters: dict[str, str] = {}
    for key, value in (session or {}).items():
        parameters[key] = value if isinstance(value, str) else json.dumps(value)
    return parameters


class MediaStreamCall(PeerCall):
    transport = "media-stream"

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        super().__init__(url, options)
        self.stream_sid = "MZ" + secrets.token_hex(16)
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._marks = 0
        # A load test without a script: keep the agent's media messages as text, parse and
        # decode them after the call.
        self._defer_decoding = bool(self.options.extra.get("defer_decoding", False))
        self._deferred: list[tuple[float, str]] = []
        self._template = MediaTemplate(self.stream_sid)
        self._chunk = 1
        self._pacer = Pacer(MonotonicClock(), PTIME)
        self._sender = InlineSend()
        self._frames: tuple[FrameWrite, asyncio.WriteTransport] | None = None
        self._leave_tick: Callable[[], None] | None = None
        self._tap: WebsocketTap | None = None
        self._polled: PolledConnection | None = None
        self._receiving: asyncio.Future[None] | None = None

    async def connect(self) -> None:
        self.start_clock()
        target = websocket_url(self.url)
        try:
            name = codec_name(self.options.codec)
        except ValueError as exc:
            raise PeerError(UNSUPPORTED, str(exc)) from None
        self.codec = name
        self._encoder = NarrowbandCodec(name, self.rate)
        self._decoder = NarrowbandCodec(name, self.rate)
        self.preencode(EncodedPlayback(media_payloads(self._encoder), self.rate // 50,
                                       base64.b64encode(self._encoder.silence),
                                       f"{name}/{self.rate}/base64"))
        headers = self.headers
        self._http = self.http()
        try:
            self._socket = await asyncio.wait_for(
                self._http.ws_connect(target, headers=headers, autoping=True),
                self.options.timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise PeerError(TIMEOUT, f"{target}: no websocket within "
                            f"{self.options.timeout:g} s") from None
        except aiohttp.WSServerHandshakeError as exc:
            await self.close()
            raise PeerError(REFUSED, f"{target}: HTTP {exc.status} {exc.message}") from None
        except (aiohttp.ClientError, OSError) as exc:
            await self.close()
            raise PeerError(CONNECT_FAILED, f"{target}: {exc or type(exc).__name__}") from None
        self.call_id = self.stream_sid
        await self._send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await self._send({
            "event": "start", "sequenceNumber": "1", "streamSid": self.stream_sid,
            "start": {
                "streamSid": self.stream_sid, "callSid": "CA" + secrets.token_hex(16),
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": ENCODINGS[name], "sampleRate": 8000,
                                "channels": 1},
                "customParameters": custom_parameters(self.options.session),
            },
        })
        self.connected_at = self.now()
        if self._defer_decoding:
            self._frames = aiohttp_frame_writer(self._socket)
            self._tap = WebsocketTap.install(self._socket, MEDIA_PREFIXES, self._keep_media,
                                             self._start_receiving)
        if self._tap is None:
            self._start_receiving()
        elif self._tap.transport is not None:
            poll = receive_poll()
            self._polled = poll.take(self._tap.transport, self._tap.deliver)
            if self._polled is not None:
                self._tap.on_burst = poll.hurry
        self._start_sending()
        # The Twilio protocol never names the agent's call id, so there is no sideband to
        # open unless the caller names the call (`extra["sideband_call_id"]`).
        self._sideband = await self._open_sideband(headers)

    async def _open_sideband(self, headers: dict[str, str]) -> Sideband | None:
        call_id = self.options.extra.get("sideband_call_id")
        if not call_id:
            if self.options.sideband:
                await self.close()
                raise PeerError(UNSUPPORTED, "the media-stream protocol does not name the "
                                "agent's call id, so it has no sideband")
            return None
        saved, self.call_id = self.call_id, str(call_id)
        try:
            return await Sideband.open_if(self, headers, self.url)
        finally:
            self.call_id = saved

    async def _send(self, message: dict[str, Any]) -> None:
        if self._socket is None or self._socket.closed:
            raise PeerError(CLOSED, "the media-stream websocket is closed")
        try:
            await self._socket.send_str(json.dumps(message))
        except (ConnectionError, RuntimeError) as exc:
            raise PeerError(CLOSED, f"the media-stream websocket is closed ({exc})") from None

    def _start_sending(self) -> None:
        """The first media message now (as a sender of its own would), the next ones on the
        shared tick."""
        now = time.monotonic()
        self._send_due(now, now)
        if self._leave_tick is None and not self._closing:
            self._leave_tick = send_tick().join(self._send_due)

    def _stop_sending(self) -> None:
        if self._leave_tick is not None:
            self._leave_tick()
            self._leave_tick = None
        self._sender.close()

    def _send_due(self, tick_at: float, now: float) -> None:
        """On the shared tick: the media messages now due (normally one), unless the last
        send still waits for the websocket's buffer to drain. In a load test each is written
        by aiohttp's frame writer directly (`aiohttp_frame_writer`), the buffer checked here
        instead of in `send_str`."""
        frames = self._frames
        if not self._sender.ready() or (
                frames is not None and frames[1].get_write_buffer_size() > SEND_BUFFER_LIMIT):
            return
        for _ in range(self._pacer.take_due(tick_at, now)):
            socket = self._socket
            if socket is None or socket.closed or self._sender.error is not None:
                self._stop_sending()  # as a sender of its own stops at a closed socket
                return
            self._chunk += 1
            message = self._template.fill(self._chunk, self.next_payload(now))
            if frames is not None:
                try:
                    frames[0](message, aiohttp.WSMsgType.TEXT, 0)
                except (ConnectionError, RuntimeError):
                    self._stop_sending()
                    return
            elif not self._sender.run(socket.send_str(message.decode("ascii"))):
                return  # waiting for the buffer: the next sends wait for it

    def _start_receiving(self) -> None:
        """The receive loop (at once, or once the tap hands over)."""
        if self._receiving is None and not self._closing:
            self._receiving = asyncio.ensure_future(self._receive())
            self._tasks.append(self._receiving)

    def _keep_media(self, arrived: float, data: str) -> None:
        self._deferred.append((arrived, data))

    async def _receive(self) -> None:
        assert self._socket is not None
        deferred = self._deferred if self._defer_decoding else None
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = message.data
            arrived = time.monotonic()
            if deferred is not None and _is_media(data):
                deferred.append((arrived, data))
            elif self._on_text(data, arrived) is not None and deferred is not None:
                deferred.append((arrived, data))  # media written otherwise: parsed again after
        if not self._closing:
            self.mark_ended("remote_hangup")

    def _on_text(self, data: str, arrived: float) -> bytes | None:
        """One text message from the agent: a media message's audio (decoded into `received`
        unless decoding is deferred), None for the others (events on the timeline)."""
        try:
            body = json.loads(data)
        except ValueError:
            self._add_event({"type": "media_stream.unreadable", "data": data[:200]}, arrived)
            return None
        if not isinstance(body, dict):
            return None
        kind = str(body.get("event"))
        if kind == "media":
            media = body.get("media")
            payload = media.get("payload") if isinstance(media, dict) else None
            try:
                audio = base64.b64decode(str(payload), validate=True)
            except (binascii.Error, ValueError):
                self._add_event({"type": "media_stream.bad_media",
                                 "payload": str(payload)[:80]}, arrived)
                return None
            if not self._defer_decoding:  # otherwise the caller keeps it for after the call
                self.received.add_samples(self._decoder.decode(audio), arrived)
            return audio
        if kind == "error":
            self._add_event({"type": "error", "error": body.get("error"),
                             "transport": self.transport}, arrived)
        self._add_event({**body, "type": f"media_stream.{kind}"}, arrived)
        return None

    def _add_event(self, event: dict[str, Any], arrived: float) -> None:
        """An event at its arrival; one parsed after the call goes in its place in time."""
        timed = self.add_event(event, arrived)
        if self.events and self.events[-1] is timed:
            self.events.pop()
            bisect.insort_right(self.events, timed, key=_event_time)

    async def send_dtmf(self, digits: str) -> None:
        """One `dtmf` message per digit, 100 ms apart (as a bridge relays key presses)."""
        for index, digit in enumerate(digits.upper()):
            if digit not in DTMF_DIGITS:
                raise PeerError("invalid_dtmf", f"{digit!r} is not a DTMF digit (0-9, *, #, "
                                "A-D)")
            if index:
                await asyncio.sleep(0.1)
            await self._send({"event": "dtmf", "streamSid": self.stream_sid,
                              "dtmf": {"track": "inbound_track", "digit": digit}})

    async def send_event(self, event: dict[str, Any]) -> None:
        """A media-stream message (`{"event": "mark", "mark": {"name": ...}}`, `clear`, ...);
        Realtime client events go over the sideband when it is open."""
        if "event" in event:
            await self._send({"streamSid": self.stream_sid, **event})
            return
        await super().send_event(event)

    async def mark(self, name: str | None = None) -> str:
        """Send a mark after the audio sent so far; the agent echoes it once its audio queued
        before the mark has gone out."""
        self._marks += 1
        label = name or f"mark-{self._marks}"
        await self._send({"event": "mark", "streamSid": self.stream_sid,
                          "mark": {"name": label}})
        return label

    async def end_remote(self, remote_ended: bool) -> None:
        # A `stop` either way: an open socket after the agent's end is still told.
        try:
            await self._send({"event": "stop", "streamSid": self.stream_sid,
                              "stop": {"callSid": self.call_id}})
        except PeerError:
            pass

    async def close(self) -> None:
        self._stop_sending()
        if not await self.begin_close():
            return
        if self._tap is not None:
            self._tap.detach()
        if self._polled is not None:
            self._polled.release()  # the transport reads the close handshake
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        if self._deferred:
            self.defer_until_finished(self._decode_deferred)

    def _decode_deferred(self) -> None:
        """The agent's media messages kept during the call: parsed, then decoded in one
        pass, each at its arrival time."""
        kept, self._deferred = self._deferred, []
        arrivals: list[float] = []
        payloads: list[bytes] = []
        for arrived, data in kept:
            audio = self._on_text(data, arrived)
            if audio is not None:
                arrivals.append(arrived)
                payloads.append(audio)
        decoded = self._decoder.decode_many(payloads)  # float32 mono at the call's rate
        for arrived, samples in zip(arrivals, decoded, strict=True):
            self.received.add_piece(samples, arrived)


def _is_media(data: str) -> bool:
    return data.startswith(MEDIA_PREFIXES)


def _event_time(timed: TimedEvent) -> float:
    return timed.t
