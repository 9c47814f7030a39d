"""Protocol-faithful fake engines: real aiohttp websocket servers on 127.0.0.1.

`FakeVllmOmni` speaks vllm-omni's duplex realtime API and `FakeMoshi` the Moshi/PersonaPlex
`/api/chat` protocol. Both echo the caller's audio (so a test can find its own signal in what
comes back) and emit text; a `Behaviour` makes them misbehave in one specific way. Every
client message is checked against the protocol and violations are recorded, so a test can
assert the agent spoke it correctly. Used by tests/remote/ and
benchmarks/remote_latency_bench.py.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import av
import numpy as np
import sphn
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

RATE = 24000
FRAME = 1920
ODD_CHUNKS = (701, 1333, 2011, 97, 1511)  # samples per audio delta: never a frame multiple


@dataclass
class Behaviour:
    capacity: int = 0  # concurrent sessions; 0 = unlimited
    handshake_delay: float = 0.0
    text_every: int = 5  # input frames per text piece
    done_every: int = 15  # input frames per transcript `.done` (vllm only)
    # One misbehaviour after `after_frames` input frames: "garbage", "wrong_format",
    # "silent" (nothing at all after the handshake), "close", "error_event", "unknown_kind",
    # "expire" (vllm: the engine ends the session).
    misbehave: str | None = None
    after_frames: int = 10
    # moshi: NVIDIA's server (moshi/server.py, ServerState.handle_chat) reads
    # request.query["voice_prompt"] and ["text_prompt"] with no default and raises when a
    # voice file is missing, dropping the socket before the 0x00 handshake.
    nvidia_prompts: bool = False
    voices: tuple[str, ...] = ("NATF2.pt", "NATM1.pt")
    # moshi: a text piece that is a tokenizer control symbol (its `id_to_piece` output for
    # ids such as <s>), sent before each word.
    control_pieces: bool = False
    # vllm: name output events as OpenAI's GA Realtime API does (response.output_audio.delta)
    # instead of as vllm-omni's projection does (response.audio.delta).
    ga_names: bool = False
    # Hold every websocket upgrade until `FakeServer.warm` is set, as vllm-omni does while its
    # engine warms up (the TCP connection is accepted at once).
    warming_up: bool = False


@dataclass
class FakeSession:
    id: str
    query: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    frames_in: int = 0
    samples_in: list[np.ndarray] = field(default_factory=list)
    closed_by_client: bool = False  # vllm: session.close received
    ended: bool = False


class FakeServer:
    path = "/"

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.sessions: list[FakeSession] = []
        self.violations: list[str] = []
        self.refused = 0
        self._transports: set[Any] = set()
        self._server: TestServer | None = None
        self._port: int | None = None
        self._ids = itertools.count(1)
        self.warm = asyncio.Event()
        if not self.behaviour.warming_up:
            self.warm.set()

    @property
    def active(self) -> int:
        return sum(1 for s in self.sessions if not s.ended)

    @property
    def url(self) -> str:
        """Stays valid after the server stopped (a dead upstream keeps its address)."""
        assert self._port is not None
        return f"ws://127.0.0.1:{self._port}{self.path}"

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_get(self.path.split("?")[0], self._handle)
        self._server = TestServer(app, host="127.0.0.1")
        # No access log of its own: a fake engine's request lines (which carry the key the
        # agent was configured with) are not the agent's log, which the tests read for leaks.
        await self._server.start_server(access_log=None)
        self._port = self._server.port
        return self

    async def kill(self) -> None:
        """Die like a crashed process: every connection drops, nothing is said."""
        for transport in list(self._transports):
            transport.abort()
        await self.close()

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
            self._server = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        await self.warm.wait()
        ws = web.WebSocketResponse(max_msg_size=8 * 1024 * 1024)
        await ws.prepare(request)
        transport = request.transport
        self._transports.add(transport)
        try:
            await self.serve(request, ws)
        except ConnectionError:
            pass
        finally:
            self._transports.discard(transport)
        return ws

    async def serve(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        raise NotImplementedError

    def violation(self, text: str) -> None:
        self.violations.append(text)


def pcm16_chunks(samples: np.ndarray, sizes: Iterator[int]) -> tuple[list[bytes], np.ndarray]:
    """Cut as many odd-sized pcm16 chunks as fit; return them and the remainder."""
    chunks: list[bytes] = []
    while True:
        size = next(sizes)
        if len(samples) < size:
            return chunks, samples
        pcm = np.clip(samples[:size] * 32768.0, -32768, 32767).astype("<i2")
        chunks.append(pcm.tobytes())
        samples = samples[size:]


class FakeVllmOmni(FakeServer):
    path = "/v1/realtime?duplex=1"

    async def serve(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        behaviour = self.behaviour
        seq = itertools.count(1)

        async def emit(event_type: str, journal: bool = True, **fields: Any) -> None:
            # vllm-omni numbers only journaled events (session_attachment.py's
            # `DuplexSessionAttachmentRegistry.send_event(..., journal=...)`): not the
            # handshake's `session.created` nor its errors (as the interop issue read them in
            # serving.py), nor `session.expired` (sent with journal=False, see "expire").
            event: dict[str, Any] = {"type": event_type, **fields}
            if journal:
                event["server_event_seq"] = next(seq)
            await ws.send_str(json.dumps(event))

        if request.query.get("duplex") != "1":
            self.violation("connected without ?duplex=1")
        first = await ws.receive()
        if first.type != WSMsgType.TEXT:
            self.violation("first message is not text")
            return
        event = json.loads(first.data)
        if event.get("type") != "session.update":
            self.violation(f"first event is {event.get('type')}, not session.update")
            return
        config = event.get("session") or {}
        if config.get("input_audio_format") != "pcm_f32le":
            self.violation(f"input_audio_format {config.get('input_audio_format')}")
        if config.get("output_audio_format") != "pcm16":
            self.violation(f"output_audio_format {config.get('output_audio_format')}")
        if behaviour.capacity and self.active >= behaviour.capacity:
            self.refused += 1
            # A full engine: `resource_exhausted`, typed as a rate limit, then the close.
            await emit("error", journal=False, error={
                "type": "rate_limit_error", "code": "resource_exhausted",
                "message": "no free duplex slots"})
            await ws.close()
            return
        session = FakeSession(id=f"duplex-{next(self._ids):08x}", config=config)
        self.sessions.append(session)
        try:
            await asyncio.sleep(behaviour.handshake_delay)
            await emit("session.created", journal=False,
                       session={"id": session.id, **config, "capabilities": {"duplex": True}})
            await self._converse(ws, session, emit)
        finally:
            session.ended = True

    async def _converse(self, ws: web.WebSocketResponse, session: FakeSession, emit: Any) -> None:
        behaviour = self.behaviour
        sizes = itertools.cycle(ODD_CHUNKS)
        pending = np.zeros(0, dtype=np.float32)
        words = itertools.count(1)
        transcript: list[str] = []
        async for message in ws:
            if message.type != WSMsgType.TEXT:
                self.violation(f"non-text message {message.type}")
                continue
            event = json.loads(message.data)
            if event.get("type") == "session.close":
                session.closed_by_client = True
                # `_from_duplex_event`: the duplex event, wrapped.
                await emit("session.closed", event={"type": "session.closed",
                                                    "session_id": session.id,
                                                    "reason": "client_closed"})
                await ws.close()
                return
            if event.get("type") != "input_audio_buffer.append":
                self.violation(f"unexpected client event {event.get('type')}")
                continue
            if event.get("format") != "pcm_f32le" or event.get("sample_rate_hz") != RATE:
                self.violation(
                    f"append with {event.get('format')} at {event.get('sample_rate_hz')}")
            frame = np.frombuffer(base64.b64decode(event["audio"]), dtype="<f4")
            if len(frame) != FRAME:
                self.violation(f"append of {len(frame)} samples")
            session.frames_in += 1
            session.samples_in.append(frame)
            n = session.frames_in
            if behaviour.misbehave == "silent":
                continue
            if behaviour.misbehave and n == behaviour.after_frames:
                if await self._misbehave(ws, emit):
                    return
            pending = np.concatenate([pending, frame])
            chunks, pending = pcm16_chunks(pending, sizes)
            # realtime_output.py, `RealtimeOutputProjector._realtime_audio_delta_events` (the
            # audio) and `_from_duplex_event` (its transcript pair and, at a turn's end,
            # `_realtime_audio_done_events`): the Realtime beta's names, unless told `ga_names`.
            audio_event, text_event, done_event = (
                ("response.output_audio.delta", "response.output_audio_transcript.delta",
                 "response.output_audio_transcript.done") if behaviour.ga_names else
                ("response.audio.delta", "response.audio_transcript.delta",
                 "response.audio_transcript.done"))
            for chunk in chunks:
                await emit(audio_event, response_id="resp_1", item_id="item_resp_1",
                           output_index=0, content_index=0,
                           delta=base64.b64encode(chunk).decode(), format="pcm16",
                           sample_rate_hz=RATE)
            if n % behaviour.text_every == 0:
                word = f"word{next(words)} "
                transcript.append(word)
                await emit(text_event, response_id="resp_1", item_id="item_resp_1",
                           output_index=0, content_index=0, delta=word)
            if n % behaviour.done_every == 0:
                await emit(done_event, response_id="resp_1", item_id="item_resp_1",
                           output_index=0, content_index=0, transcript="".join(transcript))
                transcript.clear()

    async def _misbehave(self, ws: web.WebSocketResponse, emit: Any) -> bool:
        """Returns True when the conversation is over."""
        kind = self.behaviour.misbehave
        if kind == "garbage":
            await ws.send_str("this is not json {")
        elif kind == "wrong_format":
            samples = base64.b64encode(np.zeros(960, dtype="<f4").tobytes()).decode()
            await emit("response.output_audio.delta", delta=samples, format="pcm_f32le",
                       sample_rate_hz=16000)
        elif kind == "error_event":
            await emit("error", error={"type": "invalid_request_error",
                                       "code": "invalid_audio_chunk",
                                       "message": "one chunk was dropped"})
            return False
        elif kind == "close":
            await ws.close()
            return True
        elif kind == "expire":
            # serving.py, `OmniDuplexSessionHandler._apply_runtime_lifecycle`: the engine lost
            # the session's lease; the event is sent unjournaled, then the socket closes.
            await emit("session.expired", journal=False, session_id="duplex-1", incarnation=1,
                       reason="lease_expired")
            await ws.close()
            return True
        return False


class OggOpusEncoder:
    """PyAV's Ogg muxer writing one page per Opus packet into memory: an Ogg producer
    independent of the agent's (sphn), so the agent is tested against foreign pages."""

    def __init__(self) -> None:
        self._sink = io.BytesIO()
        self._container = av.open(self._sink, "w", format="ogg",
                                  options={"page_duration": "20000"},
                                  container_options={"flush_packets": "1"})
        self._stream = self._container.add_stream("libopus", rate=RATE, layout="mono")
        self._pts = 0

    def encode(self, samples: np.ndarray) -> bytes:
        frame = av.AudioFrame.from_ndarray(samples.astype(np.float32).reshape(1, -1),
                                           format="flt", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = Fraction(1, RATE)
        self._pts += len(samples)
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        data = self._sink.getvalue()
        self._sink.seek(0)
        self._sink.truncate()
        return data


def flac_in_ogg(samples: int = FRAME * 3) -> bytes:
    """Valid Ogg pages carrying FLAC, not Opus: the wrong format on the right container."""
    sink = io.BytesIO()
    with av.open(sink, "w", format="ogg") as container:
        stream = container.add_stream("flac", rate=RATE, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), dtype=np.int16),
                                           format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = 0
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return sink.getvalue()


class FakeMoshi(FakeServer):
    """Decodes the caller with sphn (as the reference server does), echoes with PyAV Ogg."""

    path = "/api/chat"

    async def serve(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        behaviour = self.behaviour
        if behaviour.capacity and self.active >= behaviour.capacity:
            self.refused += 1
            await ws.close(code=1013, message=b"busy")
            return
        session = FakeSession(id=f"moshi-{next(self._ids)}", query=dict(request.query))
        self.sessions.append(session)
        if behaviour.nvidia_prompts:
            voice = request.query["voice_prompt"]  # KeyError: aiohttp drops the socket
            if voice not in behaviour.voices:
                raise FileNotFoundError(f"Requested voice prompt '{voice}' not found")
            if not request.query["text_prompt"]:
                raise ValueError("an empty text_prompt")
            if "seed" in request.query:
                raise KeyError("seed")  # it reads request["seed"], not the query
        try:
            await asyncio.sleep(behaviour.handshake_delay)  # prompt prefill
            await ws.send_bytes(b"\x00")
            await self._converse(ws, session)
        finally:
            session.ended = True

    async def _converse(self, ws: web.WebSocketResponse, session: FakeSession) -> None:
        behaviour = self.behaviour
        reader = sphn.OpusStreamReader(RATE)
        encoder = OggOpusEncoder()
        pending = np.zeros(0, dtype=np.float32)
        words = itertools.count(1)
        async for message in ws:
            if message.type != WSMsgType.BINARY or not message.data:
                self.violation(f"non-binary or empty message {message.type}")
                continue
            if message.data[0] != 0x01:
                self.violation(f"client sent kind {message.data[0]}")
                continue
            try:
                pcm = reader.append_bytes(message.data[1:])
            except ValueError as exc:
                self.violation(f"client audio is not Ogg-Opus: {exc}")
                continue
            pending = np.concatenate([pending, pcm])
            while len(pending) >= FRAME:
                frame, pending = pending[:FRAME], pending[FRAME:]
                session.frames_in += 1
                session.samples_in.append(frame)
                n = session.frames_in
                if behaviour.misbehave == "silent":
                    continue
                if behaviour.misbehave and n == behaviour.after_frames:
                    if await self._misbehave(ws):
                        return
                await ws.send_bytes(b"\x01" + encoder.encode(frame))
                if n % behaviour.text_every == 0:
                    if behaviour.control_pieces:
                        await ws.send_bytes(b"\x02<s>")
                    await ws.send_bytes(b"\x02" + f" word{next(words)}".encode())

    async def _misbehave(self, ws: web.WebSocketResponse) -> bool:
        kind = self.behaviour.misbehave
        if kind == "garbage":
            await ws.send_bytes(b"\x01" + b"definitely not ogg" * 4)
        elif kind == "wrong_format":
            await ws.send_bytes(b"\x01" + flac_in_ogg())
        elif kind == "unknown_kind":
            await ws.send_bytes(b"\x07hello")
        elif kind == "close":
            await ws.close()
            return True
        return False
