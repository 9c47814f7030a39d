"""One call's websocket to a remote engine, split across the two threads that use it.

Event loop side (`LinkSocket`): connect, handshake, a reader task that files what arrives
into the `LinkInbox`, a writer task that sends queued input frames. Ticker side (`exchange`,
once per frame): encode the caller's frame and hand it to the loop with
`call_soon_threadsafe`, decode whatever arrived, and return one exact output frame (silence
when nothing is there yet). Nothing on the ticker side ever waits on the network.

Protocol subclasses implement the `connect_url`/`handshake`/`on_message` (loop) and
`encode_input`/`decode_audio` (ticker thread) hooks.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from typing import Any

import aiohttp
import numpy as np

from agent.plugins.base import StepOutput
from agent.plugins.remote.inbox import LinkInbox
from agent.plugins.remote.latency import LinkLatency
from agent.plugins.remote.link_socket import LinkSocket
from agent.plugins.remote.link_types import (
    LinkRequest,
    LinkSettings,
    Outgoing,
    Payload,
    PoolEffect,
    UpstreamError,
    protocol_error,
)
from agent.plugins.remote.pool import Lease
from agent.plugins.remote.reframe import Reframer

log = logging.getLogger(__name__)

__all__ = ["LinkRequest", "LinkSettings", "Payload", "PoolEffect", "UpstreamError",
           "UpstreamLink", "protocol_error"]


class UpstreamLink(abc.ABC):
    protocol: str = "remote"

    def __init__(self, lease: Lease, settings: LinkSettings, sample_rate: int,
                 frame_size: int) -> None:
        self.lease = lease
        self.label = lease.label  # the upstream URL as it may be logged
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
        self.socket = LinkSocket(lease.label, settings, self.latency, self.on_message, self.fail)
        self.inbox = LinkInbox()
        self._closed = asyncio.Event()
        self.failure: UpstreamError | None = None
        self._failure_reported = False
        self._held_frames = 0  # input frames inside the encoder, not yet in a payload
        self._first_input_at: float | None = None
        self.frames_in = 0

    # -- protocol hooks ---------------------------------------------------------------------

    def connect_url(self, request: LinkRequest) -> str:
        return self.lease.url

    @abc.abstractmethod
    async def handshake(self, ws: aiohttp.ClientWebSocketResponse, request: LinkRequest) -> None:
        """Open the engine session; raise UpstreamError when refused (loop)."""

    @abc.abstractmethod
    def on_message(self, message: aiohttp.WSMessage, arrived_at: float) -> None:
        """File one received message in `inbox`; raise UpstreamError on garbage (loop)."""

    @abc.abstractmethod
    def encode_input(self, frame: np.ndarray) -> Payload | None:
        """One caller frame → a message to send, or None while an encoder buffers (ticker)."""

    @abc.abstractmethod
    def decode_audio(self, payload: Any) -> np.ndarray:
        """One received audio payload → float32 mono samples at the plugin rate (ticker)."""

    async def goodbye(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Say the session is over before the socket closes (loop).

        An optional hook: a protocol with no goodbye message sends nothing."""
        return None

    def handshake_timed_out(self) -> UpstreamError:
        """What a session that never opened says about the server: in trouble, by default."""
        return UpstreamError(
            "upstream_handshake_timeout",
            f"model server {self.label} did not open a session within "
            f"{self.settings.handshake_timeout:g} s", status=503, pool_effect="failed",
        )

    # -- loop side --------------------------------------------------------------------------

    async def open(self, http: aiohttp.ClientSession, request: LinkRequest) -> None:
        """Connect and open the engine session; raise UpstreamError on any failure."""
        self.loop = asyncio.get_running_loop()
        ws = await self.socket.connect(http, self.connect_url(request))
        try:
            await asyncio.wait_for(self.handshake(ws, request), self.settings.handshake_timeout)
        except asyncio.TimeoutError:
            await self.socket.close_ws()
            raise self.handshake_timed_out() from None
        except BaseException:
            await self.socket.close_ws()
            raise
        self.socket.start()

    def fail(self, error: UpstreamError) -> None:
        """The session cannot go on (loop). The call learns it at its next frame."""
        if self.failure is not None or self.socket.closing:
            return
        self.failure = error
        self._report_failure(error)

    def _report_failure(self, error: UpstreamError) -> None:
        """Log a failure, tell the pool what it says about the server, drop the socket (loop)."""
        self.socket.accepting = False
        log.warning("upstream %s session %s failed: %s: %s", self.label, self.upstream_session_id,
                    error.code, error.message)
        if error.pool_effect == "failed":
            self.lease.pool.mark_failed(self.lease.upstream, error.code)
        if not self.socket.closing:
            self.socket.spawn(self.socket.close_ws(), "abort")

    async def close(self) -> None:
        """End the engine session and free the pool seat; idempotent (loop)."""
        socket = self.socket
        if socket.closing:
            await self._closed.wait()
            return
        socket.closing = True
        socket.accepting = False
        try:
            if self.failure is None and socket.ws is not None and not socket.ws.closed:
                try:
                    await asyncio.wait_for(self.goodbye(socket.ws), self.settings.close_timeout)
                except Exception as exc:
                    log.debug("upstream %s: goodbye failed: %r", self.label, exc)
            await socket.stop_tasks()
            await socket.close_ws()
        finally:
            self.lease.release()
            self._closed.set()
            log_summary(self)

    # -- ticker thread ----------------------------------------------------------------------

    def exchange(self, frame: np.ndarray) -> StepOutput:
        """Send one caller frame, return one output frame. Never waits on the network."""
        now = time.monotonic()
        try:
            if self.failure is None:
                self._send_input(frame, now)
                self.inbox.drain(self._play_audio)
                stalled = stall_error(now, self.socket.last_inbound_at, self._first_input_at,
                                      self.settings.stall_timeout)
                if stalled is not None:
                    raise stalled
        except UpstreamError as exc:
            self._fail_from_ticker(exc)
        except Exception as exc:
            log.exception("upstream %s: exchange failed", self.label)
            self._fail_from_ticker(UpstreamError("upstream_failed",
                                                 f"the remote session failed: {exc}"))
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
        text, segment_end, notice = self.inbox.take()
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
        item = Outgoing(payload, self._held_frames, now)
        self._held_frames = 0
        assert self.loop is not None
        try:
            self.loop.call_soon_threadsafe(self.socket.enqueue, item)
        except RuntimeError:  # the loop is gone: shutting down
            pass

    def _play_audio(self, payload: Any, arrived_at: float) -> None:
        samples = self.decode_audio(payload)
        self.latency.samples_received(len(samples), arrived_at, self.lease.upstream.observe_rtt)
        self.reframer.push(samples, arrived_at)

    def _fail_from_ticker(self, error: UpstreamError) -> None:
        if self.failure is not None:
            return
        self.failure = error
        loop = self.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._report_failure, error)
            except RuntimeError:
                pass

    def restart(self) -> None:
        """Barge-in (ticker thread): drop received audio and text not yet played."""
        try:
            self.inbox.drain(self._play_audio)
        except UpstreamError as exc:
            self._fail_from_ticker(exc)
        self.reframer.clear()
        self.inbox.clear_text()

    def stats(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "upstream": self.label,
            "upstream_session_id": self.upstream_session_id,
            "frames_in": self.frames_in,
            "dropped_input_frames": self.socket.dropped_input_frames,
            "buffered_output_frames": self.reframer.buffered_frames,
            "dropped_output_frames": self.reframer.dropped_frames,
            "trimmed_output_frames": self.reframer.trimmed_frames,
            "upstream_notices": self.inbox.notices_received,
            "error": self.failure.code if self.failure else None,
            "latency": self.latency.summary(),
        }


def stall_error(now: float, last_inbound_at: float, first_input_at: float | None,
                stall_timeout: float) -> UpstreamError | None:
    """The engine owes us output only once we send input: the call may be claimed a while
    after the handshake (ICE, DTLS), and that wait is not the engine's silence."""
    assert first_input_at is not None
    silent_for = now - max(last_inbound_at, first_input_at)
    if silent_for > stall_timeout:
        return UpstreamError("upstream_stalled",
                             f"the model server sent nothing for {silent_for:.1f} s", status=504)
    return None


def log_summary(link: UpstreamLink) -> None:
    summary = link.latency.summary()
    rtt = summary["upstream_rtt"]
    log.info(
        "upstream %s session %s closed: frames_in=%d rtt_p50=%sms rtt_p95=%sms "
        "agent_added_mean=%sms error=%s",
        link.label, link.upstream_session_id, link.frames_in, rtt.get("p50_ms"),
        rtt.get("p95_ms"), summary["agent_added_mean_ms"],
        link.failure.code if link.failure else None,
    )
