"""The WebRTC transport of the headless peer, and the load-generating caller of the tests and
benchmarks.

`WebRtcCall` is the `PeerCall` on the agent's JSON `/offer` route (or any URL ending in
`/offer`; a WHIP-style URL gets an application/sdp offer), with the `oai-events` data channel
for events both ways. `run_call` is the one-shot caller the tests and capacity benchmarks use:
it can play pre-encoded packets and decode after the call (`PreencodedSignalTrack`,
`DeferredDecoding`) so hundreds of callers fit in one process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any, cast
from urllib.parse import urlparse

import aiohttp
import av
import numpy as np
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCRtpTransceiver,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME, float_to_s16
from agent.rtc_tuning import (
    InlineAudioDecoding,
    accept_rsa_dtls_peers,
    decode_audio_inline,
    limit_host_addresses,
    negotiated_codecs,
)
from agent.testing.peer.recording import PEER_RATE, Recording
from agent.testing.peer.report import CallReport
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
from agent.testing.peer.transports.direct_srtp import DirectSrtp
from agent.testing.peer.transports.ice_socket import IceSocketReader, RtpArrivals, nominated_pair
from agent.testing.peer.transports.urls import url_problem
from agent.testing.testsignal import make_test_signal, measure_echo
from agent.webrtc.encoding import InlineAudioEncoder

CHUNK = PEER_RATE // 50
MEDIA_TIMEOUT = 3.0  # seconds without a packet from the agent that end a WebRTC call


def audio_frame(chunk: np.ndarray, pts: int) -> av.AudioFrame:
    """A float32 mono chunk as the s16 frame aiortc encodes, `pts` in PEER_RATE samples."""
    frame = av.AudioFrame.from_ndarray(
        float_to_s16(chunk).reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate = PEER_RATE
    frame.pts = pts
    frame.time_base = Fraction(1, PEER_RATE)
    return frame


@functools.lru_cache(maxsize=8)
def silence_payload(codec: str) -> bytes:
    """20 ms of silence in `codec`, encoded once per process (every call sends it between
    what it plays). KeyError or ValueError for a codec the encoder does not know."""
    encoder = InlineAudioEncoder(f"audio/{codec}", PEER_RATE)
    return bytes(encoder.encode(np.zeros(CHUNK, dtype=np.int16)))


class SignalTrack(MediaStreamTrack):
    """Plays a float32 mono signal at 48 kHz in paced 20 ms frames, then silence."""

    kind = "audio"

    def __init__(self, signal: np.ndarray) -> None:
        super().__init__()
        self.signal = signal
        self.pacer = Pacer(MonotonicClock(), CHUNK / PEER_RATE)
        self.position = 0
        self.started_at: float | None = None  # monotonic time of sample 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        await self.pacer.wait_next()
        if self.started_at is None:
            self.started_at = time.monotonic()
        chunk = self.signal[self.position : self.position + CHUNK]
        if len(chunk) < CHUNK:
            chunk = np.concatenate([chunk, np.zeros(CHUNK - len(chunk), dtype=np.float32)])
        frame = audio_frame(chunk, self.position)
        self.position += CHUNK
        return frame


class PreencodedSignalTrack(MediaStreamTrack):
    """Plays packets encoded once up front: a load generator that costs almost no CPU per call.

    aiortc's sender only packs an `av.Packet`, so hundreds of callers can share one encode.
    """

    kind = "audio"

    def __init__(self, payloads: list[bytes], clock_rate: int, samples_per_packet: int) -> None:
        super().__init__()
        self.payloads = payloads
        self.pacer = Pacer(MonotonicClock(), PTIME)
        self.time_base = Fraction(1, clock_rate)
        self.samples_per_packet = samples_per_packet
        self.index = 0
        self.position = 0  # in PEER_RATE samples, like SignalTrack
        self.started_at: float | None = None

    @classmethod
    def encode(cls, signal: np.ndarray, codec: str) -> tuple[list[bytes], int, int]:
        encoder = InlineAudioEncoder(f"audio/{codec}", PEER_RATE)
        samples = float_to_s16(signal)
        payloads = [bytes(encoder.encode(samples[i : i + CHUNK]))
                    for i in range(0, len(samples) - CHUNK + 1, CHUNK)]
        return payloads, encoder.rate, encoder.samples_per_packet

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        await self.pacer.wait_next()
        if self.started_at is None:
            self.started_at = time.monotonic()
        payload = self.payloads[min(self.index, len(self.payloads) - 1)]
        packet = av.Packet(payload)
        packet.pts = self.index * self.samples_per_packet
        packet.time_base = self.time_base
        self.index += 1
        self.position += CHUNK
        return packet


class DeferredDecoding(InlineAudioDecoding):
    """A load-generating caller's receive path: notes each packet and when it arrived, and
    decodes them all after the call.

    A caller that decodes as it goes (on aiortc's decoder thread, a GIL hand-off per packet)
    runs out of CPU at fewer calls than the server under test: the capacity benchmarks then
    measure their own callers. The judgment (gaps, audio received, signal echoed) is the same,
    on the same decoded audio, with arrival taken as the packet leaves the jitter buffer.
    """

    def __init__(self, receiver: RTCRtpReceiver, channels: int = 2) -> None:
        super().__init__(receiver, channels)
        # Parallel flat lists, not a tuple or packet object per packet: a level's worth of
        # such objects (50 a second per call) would each be walked by every full collection
        # of the callers' loop, where bytes and numbers are not tracked at all.
        self.arrivals: list[float] = []
        self.codecs: list[RTCRtpCodecParameters] = []
        self.payloads: list[bytes] = []
        self.timestamps: list[int] = []
        # When each packet reached the socket, by RTP timestamp (ice_socket.RtpArrivals);
        # without it, when it left the jitter buffer.
        self.arrival_of: Callable[[int], float | None] | None = None

    def put(self, item: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if item is None:
            super().put(None)  # ends the track as usual
            return
        codec, encoded_frame = item
        arrived = (self.arrival_of(encoded_frame.timestamp)
                   if self.arrival_of is not None else None)
        self.arrivals.append(time.monotonic() if arrived is None else arrived)
        self.codecs.append(codec)
        self.payloads.append(encoded_frame.data)
        self.timestamps.append(encoded_frame.timestamp)

    def replay(self, recording: Recording) -> None:
        for arrived, codec, payload, timestamp in zip(self.arrivals, self.codecs,
                                                      self.payloads, self.timestamps, strict=True):
            for frame in self.decode(codec, JitterFrame(data=payload, timestamp=timestamp)):
                recording.add(frame, arrived)
        self.arrivals, self.codecs, self.payloads, self.timestamps = [], [], [], []


def offer_endpoint(url: str) -> tuple[str, str]:
    """(endpoint, style): JSON /offer, or application/sdp for Realtime/WHIP-style routes."""
    parsed = urlparse(url)
    path = parsed.path.rstrip("/")
    if not path:
        return url.rstrip("/") + "/offer", "json"
    return url, "json" if path.endswith("/offer") else "sdp"


def prefer_codec(pc: RTCPeerConnection, codec: str) -> None:
    capabilities = RTCRtpSender.getCapabilities("audio").codecs
    chosen = [c for c in capabilities if c.mimeType.lower() == f"audio/{codec.lower()}"]
    if not chosen:
        raise ValueError(f"unknown codec {codec}")
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio":
            transceiver.setCodecPreferences(chosen)


async def post_offer(
    http: aiohttp.ClientSession, url: str, sdp: str, session: dict[str, Any] | None,
    headers: dict[str, str],
) -> tuple[str, str | None]:
    endpoint, style = offer_endpoint(url)
    if style == "json":
        body: dict[str, Any] = {"sdp": sdp, "type": "offer"}
        if session:
            body["session"] = session
        async with http.post(endpoint, json=body, headers=headers) as response:
            payload = await response.json(content_type=None)
            if response.status != 200:
                raise RuntimeError(f"offer refused: HTTP {response.status} {payload}")
            return payload["sdp"], payload.get("call_id")
    async with http.post(
        endpoint, data=sdp, headers={**headers, "Content-Type": "application/sdp"}
    ) as response:
        text = await response.text()
        if response.status not in (200, 201):
            raise RuntimeError(f"offer refused: HTTP {response.status} {text}")
        location = response.headers.get("Location")
        return text, location.rstrip("/").rsplit("/", 1)[-1] if location else None


async def run_call(
    url: str,
    *,
    signal: np.ndarray | None = None,
    seconds: float = 5.0,
    codec: str = "opus",
    session: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    data_channel: bool = True,
    connect_timeout: float = 10.0,
    preencoded: tuple[list[bytes], int, int] | None = None,
    verify_tls: bool = True,
) -> tuple[CallReport, np.ndarray, np.ndarray]:
    """Make one call. Returns the report, the signal sent and the audio received (48 kHz)."""
    builtin = signal is None
    if signal is None:
        signal = make_test_signal(seconds)
    report = CallReport()
    recording = Recording(keep_audio=preencoded is None)
    source: SignalTrack | PreencodedSignalTrack = (
        PreencodedSignalTrack(*preencoded) if preencoded is not None else SignalTrack(signal)
    )
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    connected = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    transcript: list[str] = []

    ended = asyncio.Event()  # the call ended from the other side before its time was up

    @pc.on("connectionstatechange")
    def on_state() -> None:
        if pc.connectionState == "connected":
            connected.set()
        elif pc.connectionState in ("failed", "closed"):
            ended.set()

    deferred: list[DeferredDecoding] = []

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if not recording.keep_audio:
            receiver = next(t.receiver for t in pc.getTransceivers() if t.receiver.track is track)
            decoding = decode_audio_inline(receiver, 1, DeferredDecoding)
            if decoding is not None:
                deferred.append(decoding)

        async def record() -> None:
            while True:
                try:
                    # (aiortc types recv() Frame | Packet; an audio track's gives AudioFrames)
                    recording.add(cast(av.AudioFrame, await track.recv()))
                except MediaStreamError:
                    ended.set()
                    return
        tasks.append(asyncio.ensure_future(record()))

    if data_channel:
        channel = pc.createDataChannel("oai-events")

        @channel.on("message")
        def on_message(message: str) -> None:
            try:
                event = json.loads(message)
            except ValueError:
                return
            report.events.append(str(event.get("type")))
            if event.get("type") == "error" and isinstance(event.get("error"), dict):
                report.errors.append(event["error"])
            if event.get("type") == "response.output_audio_transcript.delta":
                transcript.append(str(event.get("delta", "")))

    pc.addTrack(source)
    prefer_codec(pc, codec)
    try:
        await pc.setLocalDescription(await pc.createOffer())
        started = time.monotonic()
        # verify_tls=False is for a development server's self-signed certificate.
        connector = aiohttp.TCPConnector(ssl=True if verify_tls else False)
        async with aiohttp.ClientSession(connector=connector) as http:
            answer, report.call_id = await post_offer(
                http, url, pc.localDescription.sdp, session, headers or {}
            )
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(connected.wait(), connect_timeout)
        report.connected = True
        report.connect_seconds = round(time.monotonic() - started, 3)
        for transceiver in pc.getTransceivers():
            codecs = negotiated_codecs(transceiver)
            if codecs:
                report.codec = codecs[0].mimeType.split("/")[-1]
        try:
            await asyncio.wait_for(ended.wait(), seconds)
            report.error = f"the call ended early (connection {pc.connectionState})"
        except asyncio.TimeoutError:
            if pc.connectionState != "connected":
                report.error = f"connection {pc.connectionState} during the call"
    except asyncio.TimeoutError:
        report.error = f"not connected within {connect_timeout:g} s"
    except Exception as exc:
        report.error = str(exc) or type(exc).__name__
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(pc.close(), 5)
        except Exception:
            pass
    for decoding in deferred:
        # Off the loop: the other calls of a capacity level may still be running.
        await asyncio.to_thread(decoding.replay, recording)
    received = recording.samples()
    report.seconds_sent = round(source.position / PEER_RATE, 3)
    report.seconds_received = round(recording.seconds, 3)
    report.loud_fraction = recording.loud_fraction()
    gaps = recording.gaps()
    report.gaps = len(gaps)
    report.max_gap_ms = round(max(gaps, default=0.0) * 1000, 1)
    report.transcript = "".join(transcript)
    if builtin and report.connected and len(received) and source.started_at and recording.first_at:
        echo = measure_echo(signal[: source.position], received, PEER_RATE)
        offset = recording.first_at - source.started_at
        report.delay_ms = round((offset + echo.lag_seconds) * 1000, 1)
        report.correlation = round(echo.correlation, 3)
        report.holes = echo.holes
        report.lag_spread_ms = round(echo.lag_spread_seconds * 1000, 1)
    return report, signal, received


# -- the PeerCall ------------------------------------------------------------------------------


class QueueTrack(MediaStreamTrack):
    """The call's outbound audio: 20 ms frames taken from its playback queue on a pacer
    (silence when nothing is queued), each recorded in `sent` as it leaves. A `parked` track
    gives aiortc's sender nothing until `unpark` (the load-test media path sends instead)."""

    kind = "audio"

    def __init__(self, call: PeerCall, encoded: tuple[int, int] | None = None,
                 parked: bool = False) -> None:
        super().__init__()
        self.call = call
        self.pacer = Pacer(MonotonicClock(), CHUNK / PEER_RATE)
        self.position = 0
        self.encoded = encoded  # (RTP clock rate, ticks per packet) when pre-encoded
        self._unparked = asyncio.Event()
        if not parked:
            self._unparked.set()

    def unpark(self) -> None:
        self._unparked.set()

    async def recv(self) -> av.AudioFrame | av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if not self._unparked.is_set():
            await self._unparked.wait()
            if self.readyState != "live":  # stopped while parked: the direct path sends
                raise MediaStreamError
        await self.pacer.wait_next()
        if self.encoded is not None:  # pre-encoded: aiortc's sender only packetizes
            clock_rate, ticks = self.encoded
            packet = av.Packet(self.call.next_payload())
            packet.pts = self.position // CHUNK * ticks
            packet.time_base = Fraction(1, clock_rate)
            self.position += CHUNK
            return packet
        chunk = self.call.next_chunk(CHUNK)
        frame = audio_frame(chunk, self.position)
        self.position += CHUNK
        return frame


class WebRtcCall(PeerCall):
    """A WebRTC call on the agent's JSON `/offer` route (a base URL gets `/offer` added), with
    the `oai-events` data channel for events both ways. DTMF: aiortc has no DTMF sender, so
    `send_dtmf` is unsupported here.

    With `extra["defer_decoding"]` (a load test without a script) the call costs the peer
    little: audio is encoded when queued, and once connected the call's audio leaves aiortc's
    media path for `DirectSrtp` (direct_srtp.py: SRTP sent on the peer's shared tick, the
    agent's packets kept as they arrive and decoded after the call,
    `PeerCall.finish_recordings`); where aiortc's internals do not allow that, aiortc's sender
    only packetizes and `DeferredDecoding` keeps the packets instead."""

    transport = "webrtc"
    default_codec = "opus"

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        super().__init__(url, options)
        self.pc: RTCPeerConnection | None = None
        self.channel: RTCDataChannel | None = None
        self._channel_open = asyncio.Event()
        self.light = bool(self.options.extra.get("defer_decoding", False))
        self._deferred: DeferredDecoding | None = None
        self._direct: DirectSrtp | None = None
        self._track: QueueTrack | None = None
        self._ice_reader: IceSocketReader | None = None
        self._arrivals: RtpArrivals | None = None

    def _preencode(self, codec: str) -> tuple[int, int]:
        """Queue audio encoded from now on; (RTP clock rate, ticks per packet)."""
        try:
            silence = silence_payload(codec)
        except (KeyError, ValueError) as exc:
            raise PeerError(UNSUPPORTED, f"unknown codec {codec}: {exc}") from None
        encoders: list[InlineAudioEncoder] = []  # the call's own, made when first needed

        def encode(samples: np.ndarray) -> list[bytes]:
            if not encoders:
                encoders.append(InlineAudioEncoder(f"audio/{codec}", PEER_RATE))
            pcm = float_to_s16(samples)
            return [bytes(encoders[0].encode(pcm[i : i + CHUNK]))
                    for i in range(0, len(pcm) - CHUNK + 1, CHUNK)]

        self.preencode(EncodedPlayback(encode, CHUNK, silence, f"{codec}/{PEER_RATE}"))
        clock_rate = 48000 if codec.lower() == "opus" else 8000
        return clock_rate, CHUNK * clock_rate // PEER_RATE

    def last_arrival(self) -> float | None:
        """Monotonic time of the agent's latest packet."""
        if self._direct is not None and self._direct.arrivals:
            return self._direct.arrivals[-1]
        arrivals = self._deferred.arrivals if self._deferred is not None else (
            self.received.arrivals)
        return arrivals[-1] if arrivals else None

    async def connect(self) -> None:
        self.start_clock()
        problem = url_problem(self.url, self.transport)
        if problem is not None:
            raise PeerError(BAD_URL, problem)
        if self.options.ice_host:
            limit_host_addresses(self.options.ice_host)
        accept_rsa_dtls_peers()
        pc = self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        connected = asyncio.Event()

        @pc.on("connectionstatechange")
        def on_state() -> None:
            if pc.connectionState == "connected":
                connected.set()
            elif pc.connectionState in ("failed", "closed") and not self._closing:
                self.mark_ended(f"connection_{pc.connectionState}")

        @pc.on("iceconnectionstatechange")
        def on_ice_state() -> None:
            if pc.iceConnectionState == "completed" and self._ice_reader is None:
                self._read_ice_socket(pc)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if self.light:
                receiver = next(t.receiver for t in pc.getTransceivers()
                                if t.receiver.track is track)
                decoding = decode_audio_inline(receiver, 1, DeferredDecoding)
                if decoding is not None:
                    decoding.arrival_of = self._arrival_of
                    self._deferred = decoding
                    self.defer_until_finished(lambda: decoding.replay(self.received))
            self._tasks.append(asyncio.ensure_future(self._record(track)))

        channel = self.channel = pc.createDataChannel("oai-events")
        channel.on("open", self._channel_open.set)
        channel.on("close", self._on_channel_close)
        channel.on("message", self._on_message)
        codec = self.options.codec or self.default_codec
        encoded = self._preencode(codec) if self.light else None
        self._track = QueueTrack(self, encoded, parked=self.light and DirectSrtp.available())
        pc.addTrack(self._track)
        try:
            prefer_codec(pc, codec)
        except ValueError as exc:
            raise PeerError(UNSUPPORTED, str(exc)) from None
        await pc.setLocalDescription(await pc.createOffer())
        try:
            answer = await self.exchange(self.requests(), pc.localDescription.sdp)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            await asyncio.wait_for(connected.wait(), self.options.timeout)
        except asyncio.TimeoutError:
            raise PeerError(TIMEOUT, f"not connected within {self.options.timeout:g} s") from None
        except aiohttp.ClientError as exc:
            raise PeerError(CONNECT_FAILED, f"{self.url}: {exc or type(exc).__name__}") from None
        except ValueError as exc:  # an answer aiortc cannot use
            raise PeerError(CONNECT_FAILED, f"bad answer: {exc}") from None
        self.connected_at = self.now()
        self._tasks.append(asyncio.ensure_future(self._watch_media()))
        for transceiver in pc.getTransceivers():
            codecs = negotiated_codecs(transceiver)
            if codecs:
                self.codec = codecs[0].mimeType.split("/")[-1]
                if self.light and transceiver.sender.track is self._track:
                    self._go_direct(transceiver, codecs[0])
        if self._track is not None:
            self._track.unpark()  # (where the direct path took over, it never sends)

    def _read_ice_socket(self, pc: RTCPeerConnection) -> None:
        """From ICE completion on, read the ICE socket here and note when each of the agent's
        RTP packets arrived (ice_socket.py): aiortc releases audio only after its jitter
        buffer, 60-80 ms later."""
        for transceiver in pc.getTransceivers():
            codecs = negotiated_codecs(transceiver)
            pair = nominated_pair(transceiver.receiver.transport)
            if not codecs or codecs[0].payloadType is None or pair is None:
                continue
            arrivals = RtpArrivals(codecs[0].payloadType)
            self._ice_reader = IceSocketReader.attach(pair.protocol, arrivals.note)
            if self._ice_reader is not None:
                self._arrivals = arrivals
            return

    def _arrival_of(self, timestamp: int) -> float | None:
        return None if self._arrivals is None else self._arrivals.take(timestamp)

    def _go_direct(self, transceiver: RTCRtpTransceiver, codec: RTCRtpCodecParameters
                   ) -> None:
        direct = DirectSrtp.attach(self, transceiver, codec, self._ice_reader)
        if direct is None:
            return
        self._direct = direct
        decoding = self._deferred or InlineAudioDecoding(transceiver.receiver, 1)
        self.defer_until_finished(lambda: direct.replay(self.received, decoding))
        if self._track is not None:
            self._track.stop()  # aiortc's sender ends its loop

    async def exchange(self, http: aiohttp.ClientSession, sdp: str) -> str:
        """Post the offer; the answer's SDP. Sets `call_id`."""
        try:
            answer, self.call_id = await post_offer(http, self.url, sdp, self.options.session,
                                                    self.headers)
        except RuntimeError as exc:
            raise PeerError(REFUSED, str(exc)) from None
        return answer

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = cast(av.AudioFrame, await track.recv())
            except MediaStreamError:
                if not self._closing:
                    self.mark_ended("remote_hangup")
                return
            self.received.add(frame, self._arrival_of(frame.pts)
                              if frame.pts is not None else None)

    async def _watch_media(self) -> None:
        """A server that ends the call closes its peer connection, which aiortc on this side
        does not notice for half a minute (ICE consent); but the agent sends audio (silence
        at least) every 20 ms, so `media_timeout` seconds without a packet end the call."""
        limit = float(self.options.extra.get("media_timeout", MEDIA_TIMEOUT))
        started = time.monotonic()
        while not self.ended.is_set():
            await asyncio.sleep(min(0.25, limit / 4))
            last = self.last_arrival() or started
            if time.monotonic() - last > limit:
                self.mark_ended("media_timeout")
                return

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except ValueError:
            return
        if isinstance(event, dict):
            self.add_event(event)

    def _on_channel_close(self) -> None:
        if not self._closing:
            self.mark_ended("remote_hangup")

    async def send_event(self, event: dict[str, Any]) -> None:
        if self.channel is None or self.channel.readyState != "open":
            try:
                await asyncio.wait_for(self._channel_open.wait(), self.options.timeout)
            except asyncio.TimeoutError:
                raise PeerError(CLOSED, "the oai-events data channel is not open") from None
        assert self.channel is not None
        self.channel.send(json.dumps(event))

    async def close(self) -> None:
        if not await self.begin_close():
            return
        if self._direct is not None:
            self._direct.stop()
        if self._ice_reader is not None:
            self._ice_reader.close()  # back to aioice, so DTLS and RTCP end as usual
        if self.pc is not None:
            try:
                await asyncio.wait_for(self.pc.close(), 5)
            except Exception:
                pass
