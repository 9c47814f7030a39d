"""The transport contract of the headless peer: one `PeerCall` per call, whatever the wire.

A transport module (webrtc, realtime, media_stream, rtp, sip) subclasses `PeerCall` and
implements `connect`, the sending of paced audio and its own end of the call (`end_remote`,
`close` after `begin_close`); the shared machinery is here: the hang-up and close sequence,
the bearer header and HTTP client, events over the sideband, the playback queue (`play`
queues audio after what is queued; a paced sender takes 20 ms at a time and gets silence
when the queue is empty), the two recordings (`sent`, `received`, both on the call's t0
timeline), the events with their times, and `wait_event`. Errors are data:
`PeerError(code, message)`.

`open_call(url, transport, options)` picks the transport by name; the modules are imported
only when asked for, so `--transport webrtc` never loads the SIP code and the other way round.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import numpy as np

from agent.errors import AgentError
from agent.testing.peer.recording import PEER_RATE, Recording
from agent.testing.peer.transports.http_client import http_clients

CHUNK_SECONDS = 0.02

# Error codes a PeerError carries.
CONNECT_FAILED = "connect_failed"
UNSUPPORTED = "unsupported"
TIMEOUT = "timeout"
CLOSED = "closed"
BAD_URL = "bad_url"
REFUSED = "refused"


class PeerError(AgentError):
    """A call that could not be made or continued, as data: a code and one clear line
    (`str()` gives both: `code: message`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass
class TimedEvent:
    t: float  # seconds since the call's t0
    event: dict[str, Any]


@dataclass
class PeerOptions:
    token: str | None = None
    session: dict[str, Any] | None = None
    codec: str | None = None  # None: the transport's default (opus for WebRTC, pcmu for phones)
    ice_host: list[str] | None = None
    insecure: bool = False  # accept any https certificate
    timeout: float = 10.0  # seconds to connect
    extra: dict[str, Any] = field(default_factory=dict)
    sideband: bool = False  # events over GET /v1/realtime?call_id=ID for transports without


class PlaybackQueue:
    """Audio waiting to be sent: `take(n)` gives the next n samples, silence-padded."""

    def __init__(self) -> None:
        self._pieces: deque[np.ndarray] = deque()
        self._queued = 0

    def put(self, samples: np.ndarray) -> None:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        if len(samples):
            self._pieces.append(samples)
            self._queued += len(samples)

    def clear(self) -> None:
        self._pieces.clear()
        self._queued = 0

    @property
    def queued(self) -> int:
        return self._queued

    def take(self, count: int) -> np.ndarray:
        out = np.zeros(count, dtype=np.float32)
        filled = 0
        while filled < count and self._pieces:
            piece = self._pieces[0]
            used = min(count - filled, len(piece))
            out[filled : filled + used] = piece[:used]
            filled += used
            if used == len(piece):
                self._pieces.popleft()
            else:
                self._pieces[0] = piece[used:]
        self._queued -= filled
        return out


SHARED_ENCODINGS = 16
_SHARED_ENCODINGS: dict[tuple[str, int, int], tuple[weakref.ref[np.ndarray], list[bytes]]] = {}


class EncodedPlayback:
    """Audio queued as encoded 20 ms payloads, encoded once when queued (a whole WAV or test
    signal in one call of the codec), so each send only hands over bytes: what keeps a peer
    placing many calls far cheaper than the agent it loads. Each payload keeps the samples it
    carries, for the `sent` recording."""

    def __init__(self, encode: Callable[[np.ndarray], list[bytes]], samples_per_packet: int,
                 silence: bytes, codec_key: str = "") -> None:
        self.encode = encode
        self.codec_key = codec_key  # names the encoding, for sharing it between calls
        self.samples_per_packet = samples_per_packet
        self.silence = silence
        self._silent_samples = np.zeros(samples_per_packet, dtype=np.float32)
        self._packets: deque[tuple[np.ndarray, bytes]] = deque()

    def put(self, samples: np.ndarray) -> None:
        samples = np.asarray(samples, dtype=np.float32).reshape(-1)
        size = self.samples_per_packet
        if len(samples) % size:
            samples = np.concatenate([samples, np.zeros(size - len(samples) % size, np.float32)])
        if not len(samples):
            return
        payloads = self._encoded(samples)
        for index, payload in enumerate(payloads):
            self._packets.append((samples[index * size : (index + 1) * size], payload))

    def _encoded(self, samples: np.ndarray) -> list[bytes]:
        """The payloads of `samples`; a read-only array (the test signal every call of a load
        test plays) is encoded once per codec and its payloads shared."""
        if samples.flags.writeable or not self.codec_key:
            return self.encode(samples)
        # Keyed by the memory it reads (a reshaped view of the same array is the same audio),
        # valid while the array that owns that memory is alive.
        owner = samples.base if isinstance(samples.base, np.ndarray) else samples
        key = (self.codec_key, samples.__array_interface__["data"][0], len(samples))
        cached = _SHARED_ENCODINGS.get(key)
        if cached is not None and cached[0]() is owner:
            return cached[1]
        payloads = self.encode(samples)
        if len(_SHARED_ENCODINGS) >= SHARED_ENCODINGS:
            _SHARED_ENCODINGS.pop(next(iter(_SHARED_ENCODINGS)))
        _SHARED_ENCODINGS[key] = (weakref.ref(owner), payloads)
        return payloads

    def clear(self) -> None:
        self._packets.clear()

    @property
    def queued(self) -> int:
        return len(self._packets) * self.samples_per_packet

    def take(self) -> tuple[np.ndarray, bytes]:
        if self._packets:
            return self._packets.popleft()
        return self._silent_samples, self.silence


class EventChannel(Protocol):
    """Where a transport without events of its own gets them (`sideband.Sideband`)."""

    async def send(self, event: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


class PeerCall(abc.ABC):
    """One call of the headless peer. Audio is float32 mono at `rate` both ways."""

    transport: str = ""
    rate: int = PEER_RATE

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        self.url = url
        self.options = options or PeerOptions()
        self.call_id: str | None = None
        self.t0 = time.monotonic()  # reset when connect starts
        keep = bool(self.options.extra.get("keep_audio", True))
        self.sent = Recording(keep_audio=keep, t0=self.t0)
        self.received = Recording(keep_audio=keep, t0=self.t0)
        self.events: list[TimedEvent] = []
        self.ended = asyncio.Event()
        self.end_reason: str | None = None
        self.codec: str | None = None  # what was negotiated
        self.connected_at: float | None = None  # seconds since t0
        # Where the transport knows them (RTP sequence numbers, RTCP reports); None otherwise.
        self.packets_received: int | None = None
        self.packets_lost: int | None = None
        self.jitter: float | None = None  # seconds, RFC 3550, where the transport computes it
        self.dtmf_received: list[TimedEvent] = []
        self._playback = PlaybackQueue()
        self._encoded: EncodedPlayback | None = None  # set by transports that pre-encode
        self._unfinished: list[Callable[[], None]] = []
        self._event_waiters: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Future[
            TimedEvent]]] = []
        self._tasks: list[asyncio.Task[None]] = []  # cancelled by `begin_close`
        self._sideband: EventChannel | None = None  # for transports without events
        self._requests: aiohttp.ClientSession | None = None  # held from http_clients
        self._closing = False

    # -- the timeline --------------------------------------------------------------------

    def start_clock(self) -> None:
        """t0 := now; called as connect starts."""
        self.t0 = time.monotonic()
        self.sent.t0 = self.t0
        self.received.t0 = self.t0

    def now(self) -> float:
        """Seconds since t0."""
        return time.monotonic() - self.t0

    # -- audio out -----------------------------------------------------------------------

    def play(self, samples: np.ndarray) -> None:
        """Queue audio after what is queued; it goes out paced in real time, 20 ms a packet."""
        if self._encoded is not None:
            self._encoded.put(samples)
        else:
            self._playback.put(samples)

    def clear_playback(self) -> None:
        self._playback.clear()
        if self._encoded is not None:
            self._encoded.clear()

    def playing(self) -> bool:
        queued = self._encoded.queued if self._encoded is not None else self._playback.queued
        return queued > 0

    def preencode(self, playback: EncodedPlayback) -> None:
        """From now on audio is queued encoded (what was queued before is encoded now)."""
        pending = self._playback.take(self._playback.queued)
        self._encoded = playback
        if len(pending):
            playback.put(pending)

    def next_payload(self, at: float | None = None) -> bytes:
        """The next 20 ms as an encoded payload (after `preencode`), its samples recorded in
        `sent` at `at` (monotonic; now by default)."""
        assert self._encoded is not None
        samples, payload = self._encoded.take()
        self.sent.add_piece(samples, time.monotonic() if at is None else at)
        return payload

    def next_chunk(self, count: int | None = None, at: float | None = None) -> np.ndarray:
        """The next `count` samples to send (20 ms by default), recorded in `sent` at `at`
        (monotonic; now by default). Transports call this at each paced send."""
        samples = self._playback.take(count or int(self.rate * CHUNK_SECONDS))
        self.sent.add_samples(samples, at)
        return samples

    # -- events --------------------------------------------------------------------------

    def add_event(self, event: dict[str, Any], at: float | None = None) -> TimedEvent:
        """A server event arrived (transports call this); wakes the matching waiters.
        `call.ending` (the server ends the call) ends it with `remote_hangup`."""
        timed = TimedEvent(round((at if at is not None else time.monotonic()) - self.t0, 6),
                           event)
        self.events.append(timed)
        if event.get("type") == "call.ending":  # the server is ending the call
            self.mark_ended("remote_hangup")
        for waiter in list(self._event_waiters):
            predicate, future = waiter
            if not future.done() and _safe_match(predicate, event):
                future.set_result(timed)
        return timed

    async def wait_event(self, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                         since: float | None = None) -> TimedEvent | None:
        """The first event matching `predicate` that arrives within `timeout` seconds, or None.

        With `since` (seconds on the call's timeline), events already received at or after
        that time count too; without it only events still to come do."""
        if since is not None:
            for timed in self.events:
                if timed.t >= since and _safe_match(predicate, timed.event):
                    return timed
        future: asyncio.Future[TimedEvent] = asyncio.get_running_loop().create_future()
        waiter = (predicate, future)
        self._event_waiters.append(waiter)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            self._event_waiters.remove(waiter)
            future.cancel()

    def defer_until_finished(self, work: Callable[[], None]) -> None:
        """Work that completes the recordings after the call (audio kept as bytes while the
        call ran, decoded later); `finish_recordings` runs it."""
        self._unfinished.append(work)

    def finish_recordings(self) -> None:
        """Complete the recordings (measure_into calls this first); idempotent."""
        while self._unfinished:
            self._unfinished.pop(0)()

    def mark_ended(self, reason: str) -> None:
        """The call is over (first reason wins)."""
        if self.end_reason is None:
            self.end_reason = reason
        self.ended.set()

    # -- the transport's part ------------------------------------------------------------

    @abc.abstractmethod
    async def connect(self) -> None:
        """Place the call; raises PeerError. Audio flows (silence until `play`) once it
        returns."""

    @property
    def headers(self) -> dict[str, str]:
        """The bearer token's header for the agent's HTTP and websocket endpoints."""
        token = self.options.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def requests(self) -> aiohttp.ClientSession:
        """The loop's shared HTTP client for short requests to the agent, each within
        `options.timeout` (http_client.py: kept-alive connections shared by the calls),
        held by this call until it closes; not to be closed by the caller."""
        if self._requests is None:
            self._requests = http_clients().hold(not self.options.insecure, self.options.timeout)
        return self._requests

    async def _release_requests(self) -> None:
        if self._requests is not None:
            self._requests = None
            await http_clients().release(not self.options.insecure, self.options.timeout)

    def http(self) -> aiohttp.ClientSession:
        """An HTTP client of the call's own for a websocket to the agent that lives as long as
        the call (no total timeout; short requests go through `requests`). `insecure`
        accepts a development server's self-signed certificate."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=False if self.options.insecure else True))

    async def send_dtmf(self, digits: str) -> None:
        raise PeerError(UNSUPPORTED, f"the {self.transport} transport cannot send DTMF")

    async def send_event(self, event: dict[str, Any]) -> None:
        """Over the sideband where one is open; the transports with an event channel of their
        own override this."""
        if self._sideband is not None:
            await self._sideband.send(event)
            return
        raise PeerError(UNSUPPORTED, f"the {self.transport} transport has no event channel")

    async def hangup(self) -> None:
        """End the call from this side (the protocol's own way, `end_remote`), then release
        it."""
        remote_ended = self.ended.is_set()
        self.mark_ended("hangup")
        await self.end_remote(remote_ended)
        await self.close()
        await self._release_requests()  # where `close` had begun before the hang-up

    async def end_remote(self, remote_ended: bool) -> None:
        """Tell the other side the call is over (BYE, DELETE, stop); `remote_ended`: it ended
        the call first. Nothing by default (closing the connection says it)."""
        return None

    async def begin_close(self) -> bool:
        """The shared start of `close`: False where closing has begun already; otherwise the
        call is marked ended, its tasks are cancelled and awaited and the sideband closed."""
        if self._closing:
            return False
        self._closing = True
        self.mark_ended("closed")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._sideband is not None:
            await self._sideband.close()
        await self._release_requests()
        return True

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything (`begin_close` first); idempotent."""

    async def __aenter__(self) -> PeerCall:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _safe_match(predicate: Callable[[dict[str, Any]], bool], event: dict[str, Any]) -> bool:
    """A predicate that cannot read an event (a missing key) does not match it."""
    try:
        return bool(predicate(event))
    except Exception:
        return False


TRANSPORTS: dict[str, str] = {
    "webrtc": "agent.testing.peer.transports.webrtc:WebRtcCall",
    "realtime": "agent.testing.peer.transports.realtime:RealtimeCall",
    "media-stream": "agent.testing.peer.transports.media_stream:MediaStreamCall",
    "rtp": "agent.testing.peer.transports.rtp:RtpCall",
    "sip": "agent.testing.peer.transports.sip:SipCall",
}


def open_call(url: str, transport: str, options: PeerOptions | None = None) -> PeerCall:
    """A not yet connected call on the named transport (await `connect()` next)."""
    target = TRANSPORTS.get(transport)
    if target is None:
        raise PeerError(UNSUPPORTED, f"unknown transport {transport!r} (one of "
                        f"{', '.join(TRANSPORTS)})")
    module_name, class_name = target.split(":")
    call_class: type[PeerCall] = getattr(importlib.import_module(module_name), class_name)
    return call_class(url, options or PeerOptions())
