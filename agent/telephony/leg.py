"""What every telephony leg shares: a ticker seat, narrowband PCM in, paced 20 ms chunks out.

Follow one frame: the transport's payload → codec decode (int16 at 8/16 kHz) →
`FrameAssembler.push_pcm16` → `TickedSession.push` → the ticker's batched step →
`on_output` → `PlayoutBuffer` → every 20 ms on the `Pacer`: pop 20 ms (silence on underrun)
→ `ChunkResampler` → codec encode → `send_chunk` (a websocket message or an RTP packet).

A leg registers with the `MediaAgent` when built (the caller holds `agent.admit()` around
setup), so it counts against the same call limit, shows in health and closes on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..call_settings import CallSettings
from ..clock import MonotonicClock
from ..events import error_event, error_event_from, server_event
from ..task_owner import TaskOwner
from ..framing import FrameAssembler
from ..pacer import Pacer
from ..playout import PlayoutBuffer
from ..rate_limit import TokenBucket
from ..errors import AgentError
from ..recording import CallRecorder, recorder_for, take_record_option
from ..plugins.base import RuntimeConfig, SessionConfig, StepOutput
from ..ticker import TickedSession
from .codec import PTIME, NarrowbandCodec
from .downsample import ChunkResampler

if TYPE_CHECKING:
    from ..media_agent import MediaAgent

log = logging.getLogger(__name__)

DTMF_DIGITS = frozenset("0123456789*#ABCD")
# A keypad sends a few digits a second; each digit is work on the model's shared worker.
DTMF_RATE = 10.0
DTMF_BURST = 20
RECENT_EVENTS = 64
WATCHDOG_INTERVAL = 0.25


class TelephonyLeg:
    kind: ClassVar[str] = "telephony"

    def __init__(self, agent: MediaAgent, codec: NarrowbandCodec,
                 settings: CallSettings | None = None) -> None:
        self.id = f"{self.kind}_{secrets.token_urlsafe(18)}"
        self.agent = agent
        self.plugin = agent.plugin
        self.ticker = agent.ticker
        self.settings = settings or agent.settings.call
        self.capabilities = self.plugin.capabilities()
        self.codec = codec
        self.dtmf_budget = TokenBucket(DTMF_RATE, DTMF_BURST)
        self.dtmf_refused = 0
        rate = self.capabilities.sample_rate
        # No re-chunking: the ticker cuts its frames from whatever arrived (see
        # Call._read_inbound), so a packet is not held back by the resampler's filter delay.
        self.assembler = FrameAssembler(rate, None, self.capabilities.channels)
        self.playout = PlayoutBuffer(int(rate * self.settings.playout_capacity_seconds))
        self.chunk_samples = int(rate * PTIME)
        self.resampler = ChunkResampler(rate, codec.sample_rate)
        self.pacer = Pacer(MonotonicClock(), PTIME)
        self.playout.follow(self.pacer, rate)
        self.ticked: TickedSession | None = None
        self.session_config = SessionConfig()
        # Recent session events (DTMF, errors) in the OpenAI Realtime shape, for observers.
        self.events: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self.recorder: CallRecorder | None = None
        self.started_at = time.monotonic()
        self.media_started_at: float | None = None  # first inbound audio
        self.last_inbound_at: float | None = None
        self.end_reason: str | None = None
        self.closed = asyncio.Event()
        self.queued_samples = 0  # agent samples ever put in the playout buffer
        self.chunks_in = 0
        self.chunks_out = 0
        self.bytes_out = 0  # encoded payload bytes (the metrics' outbound bytes)
        self.agent_chunks_out = 0  # chunks that carried agent audio (not underrun silence)
        self.tasks = TaskOwner(self.id)
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        agent.register_session(self)

    # -- lifecycle --------------------------------------------------------------------------

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Start a task this leg owns: it is cancelled when the leg closes."""
        return self.tasks.spawn(coro, name)

    async def open_session(self, session_config: SessionConfig) -> RuntimeConfig:
        """Validate the config with the plugin and take a ticker seat (AgentError if refused)."""
        session_config, record_allowed = take_record_option(session_config)
        runtime_config = await self.plugin.prepare_runtime_config(session_config)
        try:
            if self._closing:
                raise AgentError("session_closed", "the session ended during setup")
            ticked = await self.ticker.open_session(
                runtime_config, self.on_output, self.on_plugin_error
            )
        except BaseException:
            self.plugin.discard_runtime_config(runtime_config)
            raise
        if self._closing:  # closed while the seat was being made
            await self.ticker.close_session(ticked)
            raise AgentError("session_closed", "the session ended during setup")
        self.ticked = ticked
        self.session_config = session_config
        self.recorder = recorder_for(self.settings.record_dir, record_allowed, self.id,
                                     self.capabilities.sample_rate)
        if self.recorder is not None:
            ticked.tap = self.recorder.add_tick
        return runtime_config

    def start_watchdog(self) -> None:
        self.spawn(self._watchdog(), "watchdog")

    def start_sending(self) -> None:
        self.spawn(self._send_loop(), "send")

    async def _watchdog(self) -> None:
        settings = self.settings
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL)
            now = time.monotonic()
            if self.media_started_at is None:
                if now - self.started_at > settings.connect_timeout:
                    await self.close("connect_timeout")
                    return
                continue
            if now - (self.last_inbound_at or self.media_started_at) > settings.idle_timeout:
                await self.close("idle_timeout")
                return
            limit = settings.max_call_seconds
            if limit and now - self.media_started_at > limit:
                await self.close("max_call_seconds")
                return

    async def close(self, reason: str = "hangup") -> None:
        """End the leg (idempotent). The teardown runs in its own task, so a caller that is
        cancelled meanwhile (a websocket handler whose client vanished) cannot cut it short."""
        if self._close_task is None:
            self._closing = True
            self.end_reason = reason
            self._close_task = asyncio.ensure_future(self._teardown(reason))
        await asyncio.shield(self._close_task)

    async def _teardown(self, reason: str) -> None:
        self.tasks.cancel_all()
        try:
            if self.ticked is not None:
                await self.ticker.close_session(self.ticked)
        except Exception:
            log.exception("%s: closing the plugin session failed", self.id)
        if self.recorder is not None:
            await self.recorder.close()
        try:
            await self.close_transport(reason)
        except Exception as exc:
            log.warning("%s: closing the transport: %r", self.id, exc)
        self.assembler.close()
        self.resampler.close()
        self.agent.unregister_session(self)
        self.closed.set()
        log.info("%s end reason=%s duration=%.1fs", self.id, reason,
                 time.monotonic() - self.started_at)

    @property
    def closing(self) -> bool:
        return self._closing

    async def close_transport(self, reason: str) -> None:
        """Release the socket; subclasses override."""

    # -- media ------------------------------------------------------------------------------

    def push_inbound(self, pcm: np.ndarray) -> None:
        """int16 mono samples at the codec's rate from the caller."""
        now = time.monotonic()
        if self.media_started_at is None:
            self.media_started_at = now
        self.last_inbound_at = now
        self.chunks_in += 1
        if self.ticked is None or len(pcm) == 0:
            return
        for frame in self.assembler.push_pcm16(pcm, self.codec.sample_rate):
            self.ticked.push(frame)

    def on_output(self, output: StepOutput) -> None:
        if output.error is not None:
            self.report_error(error_event_from(output.error))
        reason = output.end_reason
        if reason is not None and not self._closing:
            self.spawn(self.close(reason), "plugin-end")
        audio = output.mono_audio()
        self.playout.push(audio)
        self.queued_samples += len(audio)

    def on_plugin_error(self, exc: Exception) -> None:
        if isinstance(exc, AgentError):
            self.report_error(error_event_from(exc))
        else:
            self.report_error(
                error_event("plugin_error", "the model failed to step", error_type="server_error")
            )

    def report_error(self, event: dict[str, Any]) -> None:
        """An error for the caller; subclasses also send it where their protocol allows."""
        self.note_event(event)

    def note_event(self, event: dict[str, Any]) -> None:
        """Keep a session event for stats, and in the recording."""
        self.events.append(event)
        if self.recorder is not None:
            self.recorder.add_event(event)

    @property
    def consumed_samples(self) -> int:
        """Agent samples that have left the playout buffer (sent, or dropped)."""
        return self.queued_samples - self.playout.buffered_samples

    def next_payload(self) -> bytes:
        """The next 20 ms of agent audio, encoded (silence on underrun, never blocks)."""
        audio = self.playout.pop(self.chunk_samples)
        self.chunks_out += 1
        if audio is not None:
            self.agent_chunks_out += 1
        payload = self.codec.encode(self.resampler.convert(audio))
        self.bytes_out += len(payload)
        return payload

    async def _send_loop(self) -> None:
        while True:
            await self.pacer.wait_next()
            try:
                await self.send_chunk(self.next_payload())
            except (ConnectionError, OSError, RuntimeError) as exc:
                log.info("%s: send failed (%r); ending", self.id, exc)
                self.spawn(self.close("transport_closed"), "close")
                return

    async def send_chunk(self, payload: bytes) -> None:
        raise NotImplementedError

    # -- caller events ----------------------------------------------------------------------

    def admit_dtmf(self) -> bool:
        """Whether one more keypad digit fits the rate limit (a refusal is counted)."""
        if self.dtmf_budget.take():
            return True
        self.dtmf_refused += 1
        return False

    async def dtmf(self, digit: str) -> None:
        """A keypad digit from the caller: a session event, and the plugin's hook."""
        self.note_event(
            server_event("input_audio_buffer.dtmf_event_received", event=digit,
                         received_at=int(time.time()))
        )
        log.info("%s dtmf %s", self.id, digit)
        if self.ticked is not None:
            await self.ticker.send_dtmf(self.ticked, digit)

    # -- reporting --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        rate = self.capabilities.sample_rate
        return {
            "call_id": self.id,
            "kind": self.kind,
            "plugin": self.plugin.id,
            "codec": self.codec.name,
            "age_s": round(time.monotonic() - self.started_at, 3),
            "chunks_in": self.chunks_in,
            "chunks_out": self.chunks_out,
            "agent_chunks_out": self.agent_chunks_out,
            "inbound": self.ticked.counters.to_dict() if self.ticked else None,
            "playout": {
                "buffered_ms": round(self.playout.buffered_samples / rate * 1000, 1),
                "dropped_samples": self.playout.dropped_samples,
                "underrun_chunks": self.playout.underrun_chunks,
                "reanchors": self.pacer.reanchors,
                "trimmed_ms": round(self.playout.trimmed_samples / rate * 1000, 1),
                "short_chunks": self.resampler.short_chunks,
            },
            "dtmf_refused": self.dtmf_refused,
            "events": [event["type"] for event in self.events],
        }
