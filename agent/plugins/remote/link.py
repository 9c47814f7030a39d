"""One call's websocket to a remote engine, split across the two threads that use it.

Event loop side: connect, handshake, a reader task that files what arrives into an inbox, a
writer task that sends queued input frames. Ticker side (`exchange`, once per frame): encode
the caller's frame and hand it to the loop with `call_soon_threadsafe`, decode whatever
arrived, and return one exact output frame (silence when nothing is there yet). Nothing on the
ticker side ever waits on the network.

Protocol subclasses implement the `connect_url`/`handshake`/`on_message` (loop) and
`encode_input`/`decode_audio` (ticker thread) hooks.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np

from ...redact import redact_text
from ..base import PluginError, StepOutput
from .latency import LinkLatency
from .pool import Lease
from .reframe import Reframer

log = logging.getLogger(__name__)

PoolEffect = Literal["failed", "full"] | None
Payload = str | bytes
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class UpstreamError(PluginError):
    """A remote engine problem. `pool_effect` says what it means for that server's health."""

    def __init__(self, code: str, message: str, *, status: int = 502,
                 pool_effect: PoolEffect = None) -> None:
        # Messages embed exception text (aiohttp puts the URL in it): it reaches clients,
        # logs and /health, so credentials are masked here, once for every path.
        super().__init__(code, redact_text(message), status=status)
        self.pool_effect = pool_effect


def protocol_error(message: str) -> UpstreamError:
    return UpstreamError("upstream_protocol_error", f"the model server broke protocol: {message}")


@dataclass(frozen=True)
class LinkSettings:
    connect_timeout: float = 5.0
    handshake_timeout: float = 20.0  # a Moshi server prefills its prompt before answering
    stall_timeout: float = 5.0  # no message from the engine this long while sending → error
    close_timeout: float = 2.0
    max_output_seconds: float = 2.0  # received audio not yet played; older frames dropped
    max_queued_input_frames: int = 25  # input waiting for the socket; oldest dropped


@dataclass(frozen=True)
class LinkRequest:
    """What the engine is asked for when the session opens."""

    voice: str | None = None
    instructions: str | None = None
    model: str | None = None


@dataclass
class _Outgoing:
    payload: Payload
    frames: int  # input frames this payload completes (an encoder may hold some back)
    queued_at: float


class UpstreamLink(abc.ABC):
    protocol: str = "remote"

    def __init__(self, lease: Lease, settings: LinkSettings, sample_rate: int,
                 frame_size: int) -> None:
        self.lease = lease
        self.settings = settings
        self.sample_rate = sample_rate
        self.frame_size = frame_size
        self.silence = np.zeros(frame_size, dtype=np.float32)
        self.latency = LinkLatency(frame_size)
        self.reframer = Reframer(
            frame_size, max(1, int(settings.max_output_seconds * sample_rate / frame_size))
        )
        self.upstream_session_id: str | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        # Loop → ticker thread: ("audio", payload, arrived_at) | ("text", str) |
        # ("segment_end",) | ("notice", PluginError). deque append/popleft are atomic.
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._outgoing: deque[_Outgoing] = deque()
        self._outgoing_ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._closed = asyncio.Event()
        self.failure: UpstreamError | None = None
        self._failure_reported = False
        self._notices: deque[PluginError] = deque()
        self._text: list[str] = []
        self._segment_end = False
        self._held_frames = 0  # input frames inside the encoder, not yet in a payload
        self.last_inbound_at = time.monotonic()
        self._first_input_at: float | None = None
        self.frames_in = 0
        self.dropped_input_frames = 0
        self.notices_received = 0

    @property
    def url(self) -> str:
        return self.lease.url  # to connect to only; print and serve `label`

    @property
    def label(self) -> str:
        return self.lease.label

    # -- protocol hooks ---------------------------------------------------------------------

    def connect_url(self, request: LinkRequest) -> str:
        return self.lease.url

    @abc.abstractmethod
    async def handshake(self, ws: aiohttp.ClientWebSocketResponse, request: LinkRequest) -> None:
        """Open the engine session; raise UpstreamError when refused (loop)."""

    @abc.abstractmethod
    def on_message(self, message: aiohttp.WSMessage, arrived_at: float) -> None:
        """File one received message with `file_*`; raise UpstreamError on garbage (loop)."""

    @abc.abstractmethod
    def encode_input(self, frame: np.ndarray) -> Payload | None:
        """One caller frame → a message to send, or None while an encoder buffers (ticker)."""

    @abc.abstractmethod
    def decode_audio(self, payload: Any) -> np.ndarray:
        """One received audio payload → float32 mono samples at the plugin rate (ticker)."""

    async def goodbye(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Say the session is over before the socket closes (loop)."""

    # -- filing what arrived (loop) ---------------------------------------------------------

    def file_audio(self, payload: Any, arrived_at: float) -> None:
        self._inbox.append(("audio", payload, arrived_at))

    def file_text(self, text: str) -> None:
        self._inbox.append(("text", text))

    def file_segment_end(self) -> None:
        self._inbox.append(("segment_end",))

    def file_notice(self, error: PluginError) -> None:
        self.notices_received += 1
        self._inbox.append(("notice", error))

    # -- loop side --------------------------------------------------------------------------

    async def open(self, http: aiohttp.ClientSession, request: LinkRequest) -> None:
        """Connect and open the engine session; raise UpstreamError on any failure."""
        self.loop = asyncio.get_running_loop()
        url = self.connect_url(request)
        try:
            self.ws = await asyncio.wait_for(
                http.ws_connect(url, max_msg_size=MAX_MESSAGE_BYTES, autoping=True),
                self.settings.connect_timeout,
            )
        except asyncio.TimeoutError:
            raise UpstreamError(
                "upstream_unreachable", f"no answer from model server {self.label} within "
                f"{self.settings.connect_timeout:g} s", status=503, pool_effect="failed",
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                "upstream_unreachable", f"model server {self.label} cannot be reached: {exc}",
                status=503, pool_effect="failed",
            ) from None
        try:
            await asyncio.wait_for(self.handshake(self.ws, request),
                                   self.settings.handshake_timeout)
        except asyncio.TimeoutError:
            await self._close_socket()
            raise self.handshake_timed_out() from None
        except BaseException:
            await self._close_socket()
            raise
        self.last_inbound_at = time.monotonic()
        self._spawn(self._read(), "read")
        self._spawn(self._write(), "write")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"upstream:{self.label}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                now = time.monotonic()
                self.last_inbound_at = now
                if message.type == aiohttp.WSMsgType.ERROR:
                    raise UpstreamError(
                        "upstream_closed", f"the connection to the model server failed: "
                        f"{self.ws.exception()}", pool_effect="failed",
                    )
                self.on_message(message, now)
            if not self._closing:
                code = self.ws.close_code
                # A normal close is the engine ending this session; anything else (going
                # away, abort, 1006) says the server itself is in trouble.
                self.fail(UpstreamError(
                    "upstream_closed", f"the model server closed the connection (code {code})",
                    pool_effect=None if code == 1000 else "failed",
                ))
        except UpstreamError as exc:
            self.fail(exc)
        except Exception as exc:
            log.exception("upstream %s: reader failed", self.label)
            self.fail(UpstreamError("upstream_failed", f"reading from the model server failed: {exc}"))

    async def _write(self) -> None:
        assert self.ws is not None
        try:
            while True:
                while not self._outgoing:
                    self._outgoing_ready.clear()
                    await self._outgoing_ready.wait()
                item = self._outgoing.popleft()
                if isinstance(item.payload, bytes):
                    await self.ws.send_bytes(item.payload)
                else:
                    await self.ws.send_str(item.payload)
                self.latency.frames_sent(item.frames, item.queued_at, time.monotonic())
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            self.fail(UpstreamError(
                "upstream_closed", f"sending to the model server failed: {exc}",
                pool_effect="failed",
            ))

    def _enqueue(self, item: _Outgoing) -> None:
        if self._closing or self.failure is not None:
            return
        if len(self._outgoing) >= self.settings.max_queued_input_frames:
            dropped = self._outgoing.popleft()
            self.dropped_input_frames += dropped.frames
        self._outgoing.append(item)
        self._outgoing_ready.set()

    def handshake_timed_out(self) -> UpstreamError:
        """What a session that never opened says about the server: in trouble, by default."""
        return UpstreamError(
            "upstream_handshake_timeout",
            f"model server {self.label} did not open a session within "
            f"{self.settings.handshake_timeout:g} s", status=503, pool_effect="failed",
        )

    def fail(self, error: UpstreamError) -> None:
        """The session cannot go on (loop). The call learns it at its next frame."""
        if self.failure is not None or self._closing:
            return
        self.failure = error
        log.warning("upstream %s session %s failed: %s: %s", self.label, self.upstream_session_id,
                    error.code, error.message)
        if error.pool_effect == "failed":
            self.lease.pool.mark_failed(self.lease.upstream, error.code)
        self._spawn(self._close_socket(), "abort")

    async def close(self) -> None:
        """End the engine session and free the pool seat; idempotent (loop)."""
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if self.failure is None and self.ws is not None and not self.ws.closed:
                try:
                    await asyncio.wait_for(self.goodbye(self.ws), self.settings.close_timeout)
                except Exception as exc:
                    log.debug("upstream %s: goodbye failed: %r", self.label, exc)
            current = asyncio.current_task()
            tasks = [t for t in self._tasks if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close_socket()
        finally:
            self.lease.release()
            self._closed.set()
            self._log_summary()

    async def _close_socket(self) -> None:
        if self.ws is not None and not self.ws.closed:
            try:
                await asyncio.wait_for(self.ws.close(), self.settings.close_timeout)
            except Exception as exc:
                log.debug("upstream %s: close failed: %r", self.label, exc)

    def _log_summary(self) -> None:
        summary = self.latency.summary()
        rtt = summary["upstream_rtt"]
        log.info(
            "upstream %s session %s closed: frames_in=%d rtt_p50=%sms rtt_p95=%sms "
            "agent_added_mean=%sms error=%s",
            self.label, self.upstream_session_id, self.frames_in, rtt.get("p50_ms"),
            rtt.get("p95_ms"), summary["agent_added_mean_ms"],
            self.failure.code if self.failure else None,
        )

    # -- ticker thread ----------------------------------------------------------------------

    def exchange(self, frame: np.ndarray) -> StepOutput:
        """Send one caller frame, return one output frame. Never waits on the network."""
        now = time.monotonic()
        try:
            if self.failure is None:
                self._send_input(frame, now)
                self._drain_inbox()
                self._check_stall(now)
        except UpstreamError as exc:
            self._fail_from_ticker(exc)
        except Exception as exc:
            log.exception("upstream %s: exchange failed", self.label)
            self._fail_from_ticker(UpstreamError("upstream_failed", f"the remote session failed: {exc}"))
        if self.failure is not None:
            if self._failure_reported:
                return StepOutput(audio=self.silence)
            self._failure_reported = True
            return StepOutput(audio=self.silence, error=self.failure, end_call=True)
        popped = self.reframer.pop()
        audio = self.silence
        if popped is not None:
            audio, completed_at = popped
            self.latency.output_hold.add(now - completed_at)
        text = "".join(self._text)
        self._text.clear()
        segment_end, self._segment_end = self._segment_end, False
        notice = self._notices.popleft() if self._notices else None
        return StepOutput(audio=audio, text=text, segment_end=segment_end, error=notice)

    def _send_input(self, frame: np.ndarray, now: float) -> None:
        if self._first_input_at is None:
            self._first_input_at = now
        self.frames_in += 1
        mono = frame if frame.ndim == 1 else frame.mean(axis=1)
        payload = self.encode_input(np.ascontiguousarray(mono, dtype=np.float32))
        self._held_frames += 1
        if payload is None:
            return
        item = _Outgoing(payload, self._held_frames, now)
        self._held_frames = 0
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(self._enqueue, item)
        except RuntimeError:  # the loop is gone: shutting down
            pass

    def _drain_inbox(self) -> None:
        while self._inbox:
            entry = self._inbox.popleft()
            kind = entry[0]
            if kind == "audio":
                samples = self.decode_audio(entry[1])
                self.latency.samples_received(len(samples), entry[2],
                                              self.lease.upstream.observe_rtt)
                self.reframer.push(samples, entry[2])
            elif kind == "text":
                self._text.append(entry[1])
            elif kind == "segment_end":
                self._segment_end = True
            elif kind == "notice":
                self._notices.append(entry[1])

    def _check_stall(self, now: float) -> None:
        # The engine owes us output only once we send input: the call may be claimed a while
        # after the handshake (ICE, DTLS), and that wait is not the engine's silence.
        assert self._first_input_at is not None
        silent_for = now - max(self.last_inbound_at, self._first_input_at)
        if silent_for > self.settings.stall_timeout:
            raise UpstreamError(
                "upstream_stalled",
                f"the model server sent nothing for {silent_for:.1f} s",
                status=504,
            )

    def _fail_from_ticker(self, error: UpstreamError) -> None:
        if self.failure is not None:
            return
        self.failure = error
        loop = self.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._after_ticker_failure, error)
            except RuntimeError:
                pass

    def _after_ticker_failure(self, error: UpstreamError) -> None:
        log.warning("upstream %s session %s failed: %s: %s", self.label, self.upstream_session_id,
                    error.code, error.message)
        if error.pool_effect == "failed":
            self.lease.pool.mark_failed(self.lease.upstream, error.code)
        if not self._closing:
            self._spawn(self._close_socket(), "abort")

    def restart(self) -> None:
        """Barge-in (ticker thread): drop received audio and text not yet played."""
        self._drain_inbox_safely()
        self.reframer.clear()
        self._text.clear()

    def _drain_inbox_safely(self) -> None:
        try:
            self._drain_inbox()
        except UpstreamError as exc:
            self._fail_from_ticker(exc)

    def stats(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "upstream": self.label,
            "upstream_session_id": self.upstream_session_id,
            "frames_in": self.frames_in,
            "dropped_input_frames": self.dropped_input_frames,
            "buffered_output_frames": self.reframer.buffered_frames,
            "dropped_output_frames": self.reframer.dropped_frames,
            "trimmed_output_frames": self.reframer.trimmed_frames,
            "upstream_notices": self.notices_received,
            "error": self.failure.code if self.failure else None,
            "latency": self.latency.summary(),
        }
