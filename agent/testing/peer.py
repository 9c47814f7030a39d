"""`python -m agent.peer URL`: a headless WebRTC caller for smoke tests and bridges.

It calls a running agent, plays a WAV (or the built-in test signal), records what comes
back, and reports: connected, seconds sent/received, the round-trip delay of the test signal,
and gaps in the received audio. Exit status is non-zero when the call fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import wave
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, cast
from urllib.parse import urlparse

import aiohttp
import av
import numpy as np
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME, float_to_s16
from agent.cli_errors import CliError, exit_with_error
from agent.rtc_tuning import (
    InlineAudioDecoding,
    accept_rsa_dtls_peers,
    decode_audio_inline,
    limit_host_addresses,
    negotiated_codecs,
)
from agent.testing.testsignal import make_test_signal, measure_echo
from agent.webrtc.encoding import InlineAudioEncoder

PEER_RATE = 48000
CHUNK = PEER_RATE // 50
GAP_SECONDS = 0.06
LOUD_RMS_S16 = 300.0  # the test signal is about 8000 RMS; silence and codec noise far below


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
        frame = av.AudioFrame.from_ndarray(
            float_to_s16(chunk).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = PEER_RATE
        frame.pts = self.position
        frame.time_base = Fraction(1, PEER_RATE)
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


@dataclass
class Recording:
    chunks: list[np.ndarray] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    first_at: float | None = None
    keep_audio: bool = True  # False: count samples only (cheap, for load generation)
    counted_samples: int = 0
    loud: list[bool] = field(default_factory=list)  # per frame, in count-only mode
    resampler: av.AudioResampler = field(
        default_factory=lambda: av.AudioResampler(format="flt", layout="mono", rate=PEER_RATE)
    )

    def add(self, frame: av.AudioFrame, arrived: float | None = None) -> None:
        now = time.monotonic() if arrived is None else arrived
        if self.first_at is None:
            self.first_at = now
        self.arrivals.append(now)
        if not self.keep_audio:
            self.counted_samples += frame.samples * PEER_RATE // frame.sample_rate
            pcm = frame.to_ndarray().astype(np.float32)
            self.loud.append(float(np.sqrt(np.mean(pcm * pcm))) > LOUD_RMS_S16)
            return
        frame.pts = None
        for out in self.resampler.resample(frame):
            self.chunks.append(out.to_ndarray().reshape(-1).copy())

    @property
    def seconds(self) -> float:
        kept = sum(len(chunk) for chunk in self.chunks)
        return (kept + self.counted_samples) / PEER_RATE

    def samples(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self.chunks).astype(np.float32)

    def loud_fraction(self) -> float | None:
        """Of the frames between the first and the last loud one, the share that was loud.

        A caller playing a continuous signal into an echo should get it back without silent
        holes; a server that falls behind and fills with silence shows up here even when its
        packets keep arriving on time.
        """
        if True not in self.loud:
            return None
        first = self.loud.index(True)
        last = len(self.loud) - 1 - self.loud[::-1].index(True)
        span = self.loud[first : last + 1]
        return sum(span) / len(span)

    def gaps(self, skip_seconds: float = 1.0) -> list[float]:
        if not self.arrivals:
            return []
        start = self.arrivals[0] + skip_seconds
        times = [t for t in self.arrivals if t >= start]
        return [b - a for a, b in zip(times, times[1:], strict=False) if b - a > GAP_SECONDS]


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

    def put(self, item: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if item is None:
            super().put(None)  # ends the track as usual
            return
        codec, encoded_frame = item
        self.arrivals.append(time.monotonic())
        self.codecs.append(codec)
        self.payloads.append(encoded_frame.data)
        self.timestamps.append(encoded_frame.timestamp)

    def replay(self, recording: Recording) -> None:
        for arrived, codec, payload, timestamp in zip(self.arrivals, self.codecs,
                                                      self.payloads, self.timestamps, strict=True):
            for frame in self.decode(codec, JitterFrame(data=payload, timestamp=timestamp)):
                recording.add(frame, arrived)
        self.arrivals, self.codecs, self.payloads, self.timestamps = [], [], [], []


@dataclass
class CallReport:
    connected: bool = False
    error: str | None = None
    call_id: str | None = None
    codec: str | None = None
    connect_seconds: float | None = None
    seconds_sent: float = 0.0
    seconds_received: float = 0.0
    delay_ms: float | None = None
    correlation: float | None = None
    holes: int | None = None  # 250 ms windows after the first second that did not come back
    lag_spread_ms: float | None = None
    gaps: int = 0
    max_gap_ms: float = 0.0
    loud_fraction: float | None = None  # count-only calls: share of the echo that was audio
    events: list[str] = field(default_factory=list)
    transcript: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)  # `error` events' bodies

    @property
    def ok(self) -> bool:
        return self.connected and self.error is None and self.seconds_received > 0


def load_wav(path: str, rate: int = PEER_RATE) -> np.ndarray:
    """Any WAV → float32 mono at `rate` (PyAV reads and resamples it)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    parts = []
    with av.open(path) as container:
        for frame in container.decode(audio=0):
            frame.pts = None
            parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def save_wav(path: str, samples: np.ndarray, sample_rate: int = PEER_RATE) -> None:
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(float_to_s16(samples).tobytes())


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agent.peer", description=__doc__)
    parser.add_argument("url", help="agent base URL (http://host:port) or an offer endpoint")
    parser.add_argument("--play", help="WAV to send (default: the built-in test signal)")
    parser.add_argument("--record", help="write the received audio to this WAV")
    parser.add_argument("--seconds", type=float, default=None,
                        help="call length (default: the --play file's length plus 1 s to hear "
                        "its end come back, or 5 with the built-in signal)")
    parser.add_argument("--codec", choices=["opus", "pcmu", "pcma"], default="opus")
    parser.add_argument("--session", help="session config JSON (voice, instructions, ...)")
    parser.add_argument("--token", help="Bearer token for the agent")
    parser.add_argument("--ice-host", action="append", default=None, metavar="ADDR",
                        help="gather ICE host candidates only on this address (repeatable)")
    parser.add_argument("--insecure", action="store_true",
                        help="accept any https certificate (a self-signed development server)")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON report (data-channel events as counts per type)")
    return parser


TAIL_SECONDS = 1.0  # after a --play file ends, long enough to hear its end come back


def read_play_file(path: str) -> np.ndarray:
    try:
        signal = load_wav(path)
    except FileNotFoundError:
        raise CliError("play_not_found", f"--play {path}: no such file") from None
    except (OSError, av.error.FFmpegError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "not a readable audio file"
        raise CliError("play_unreadable", f"--play {path}: {reason}") from None
    if len(signal) == 0:
        raise CliError("play_empty", f"--play {path}: no audio in the file")
    return signal


def check_record_path(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError("record_unwritable", f"--record {path}: folder {folder} does not exist")
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise CliError("record_unwritable", f"--record {path}: cannot write there")


def parse_session(text: str) -> dict[str, Any]:
    try:
        session = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError("invalid_session", f"--session is not valid JSON ({exc.msg} at "
                       f"character {exc.pos})") from None
    if not isinstance(session, dict):
        raise CliError("invalid_session", "--session must be a JSON object, e.g. "
                       '\'{"voice": "NATF2.pt"}\'')
    return session


def event_counts(events: list[str]) -> dict[str, int]:
    """Event types in the order first seen, each with how often it came."""
    counts: dict[str, int] = {}
    for event in events:
        counts[event] = counts.get(event, 0) + 1
    return counts


def print_report(report: CallReport, as_json: bool) -> None:
    if as_json:
        body = {**asdict(report), "events": event_counts(report.events), "ok": report.ok}
        print(json.dumps(body, indent=2))
        return
    status = "ok" if report.ok else f"FAILED: {report.error or 'no audio received'}"
    print(f"{status}  codec={report.codec} connect={report.connect_seconds}s "
          f"sent={report.seconds_sent}s received={report.seconds_received}s "
          f"delay={report.delay_ms}ms corr={report.correlation} holes={report.holes} "
          f"gaps={report.gaps}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        # Every argument is checked before dialling, so a typo costs no call.
        signal = read_play_file(args.play) if args.play else None
        if args.record:
            check_record_path(args.record)
        session = parse_session(args.session) if args.session else None
    except CliError as exc:
        exit_with_error(exc.code, exc.message)
    seconds = args.seconds
    if seconds is None:
        seconds = len(signal) / PEER_RATE + TAIL_SECONDS if signal is not None else 5.0
    accept_rsa_dtls_peers()
    if args.ice_host:
        limit_host_addresses(args.ice_host)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    report, _, received = asyncio.run(
        run_call(args.url, signal=signal, seconds=seconds, codec=args.codec,
                 session=session, headers=headers, verify_tls=not args.insecure)
    )
    if args.record:
        try:
            save_wav(args.record, received)
        except OSError as exc:
            report.error = report.error or f"--record {args.record}: {exc.strerror or exc}"
    print_report(report, args.json)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
