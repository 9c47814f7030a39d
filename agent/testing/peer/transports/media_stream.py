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
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import secrets
import time
from typing import Any
from urllib.parse import urlparse, urlunparse

import aiohttp

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
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
)
from agent.testing.peer.transports.narrowband import NarrowbandCodec, codec_name
from agent.testing.peer.transports.sideband import Sideband

DEFAULT_PATH = "/v1/telephony/media-stream"
ENCODINGS = {"PCMU": "audio/x-mulaw", "PCMA": "audio/x-alaw"}
DTMF_DIGITS = "0123456789*#ABCD"


def websocket_url(url: str) -> str:
    parsed = urlparse(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parsed.scheme)
    if scheme is None or not parsed.netloc:
        raise PeerError(BAD_URL, f"{url}: the media-stream transport needs an http(s):// or "
                        "ws(s):// URL")
    path = parsed.path if parsed.path.rstrip("/") else DEFAULT_PATH
    return urlunparse((scheme, parsed.netloc, path, "", parsed.query, ""))


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
        # A load test without a script: keep the agent's audio as bytes, decode after the call.
        self._defer_decoding = bool(self.options.extra.get("defer_decoding", False))
        self._deferred: list[tuple[float, bytes]] = []

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
        self.preencode(EncodedPlayback(self._encoder.encode_packets, self.rate // 50,
                                       self._encoder.silence, f"{name}/{self.rate}"))
        headers = self.headers
        self._http = self.http(bounded=False)
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
        self._tasks.append(asyncio.ensure_future(self._receive()))
        self._tasks.append(asyncio.ensure_future(self._send_audio()))
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

    async def _send_audio(self) -> None:
        pacer = Pacer(MonotonicClock(), 0.02)
        chunk = 1
        while True:
            await pacer.wait_next()
            payload = self.next_payload()
            chunk += 1
            try:
                await self._send({
                    "event": "media", "streamSid": self.stream_sid,
                    "media": {"track": "inbound", "chunk": str(chunk),
                              "payload": base64.b64encode(payload).decode("ascii")},
                })
            except PeerError:
                return

    async def _receive(self) -> None:
        assert self._socket is not None
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                body = json.loads(message.data)
            except ValueError:
                self.add_event({"type": "media_stream.unreadable", "data": message.data[:200]})
                continue
            if not isinstance(body, dict):
                continue
            self._on_message(body)
        if not self._closing:
            self.mark_ended("remote_hangup")

    def _on_message(self, body: dict[str, Any]) -> None:
        kind = str(body.get("event"))
        if kind == "media":
            media = body.get("media")
            payload = media.get("payload") if isinstance(media, dict) else None
            try:
                audio = base64.b64decode(str(payload), validate=True)
            except (binascii.Error, ValueError):
                self.add_event({"type": "media_stream.bad_media", "payload": str(payload)[:80]})
                return
            if self._defer_decoding:
                self._deferred.append((time.monotonic(), audio))
            else:
                self.received.add_samples(self._decoder.decode(audio))
            return
        if kind == "error":
            self.add_event({"type": "error", "error": body.get("error"),
                            "transport": self.transport})
        self.add_event({**body, "type": f"media_stream.{kind}"})

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
        if not await self.begin_close():
            return
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        if self._deferred:
            self.defer_until_finished(self._decode_deferred)

    def _decode_deferred(self) -> None:
        decoded = self._decoder.decode_many([audio for _, audio in self._deferred])
        for (arrived, _), samples in zip(self._deferred, decoded, strict=True):
            self.received.add_samples(samples, arrived)
        self._deferred = []
