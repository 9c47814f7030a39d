"""One conversation's lifecycle, whatever carries its audio.

A leg holds a plugin slot (its seat at the ticker), a playout buffer, a watchdog, the
recording, the session events and a teardown that always completes. Transports are small
subclasses that feed caller audio in (`push_caller_audio`) and take paced agent audio out of
`playout`: WebRTC (webrtc/leg.py), the media-stream websocket and plain RTP (telephony/).

Follow one frame: the transport's decoded caller audio → `FrameAssembler` (resample to the
plugin's rate) → `PluginSlot.push` → the ticker's batched `plugin.step` → `on_output` →
`PlayoutBuffer` → the transport's 20 ms pacer → the wire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from agent.audio.framing import FrameAssembler
from agent.audio.pacer import Pacer
from agent.audio.playout import PlayoutBuffer
from agent.call_settings import CallSettings
from agent.end_reason import Ending, EndReason
from agent.errors import AgentError, CallError
from agent.plugins.base import Plugin, PluginError, RuntimeConfig, SessionConfig, StepOutput
from agent.realtime.events import error_event, error_event_from
from agent.realtime.sideband import SidebandHub
from agent.recording import CallRecorder, recorder_for, take_record_option
from agent.task_owner import TaskOwner
from agent.ticker import PluginSlot, Ticker
from agent.watchdog import Watchdog

log = logging.getLogger(__name__)

RECENT_EVENTS = 64
WATCHDOG_INTERVAL = 0.25  # seconds between the watchdog's looks
NOTICE_SECONDS = 0.2  # time for a last event to leave before the transport closes


@dataclass(frozen=True)
class PreparedConfig:
    """What the caller asked for, validated by the plugin, before a leg takes its seat."""

    session_config: SessionConfig
    runtime_config: RuntimeConfig
    record_allowed: bool


async def prepare_config(plugin: Plugin, session_config: SessionConfig) -> PreparedConfig:
    """Validate a caller's config with the plugin (AgentError if refused). The plugin may
    reserve resources for it (a remote engine's session): hand the result to
    `Leg.open_plugin_slot`, or back with `plugin.discard_runtime_config`."""
    session_config, record_allowed = take_record_option(session_config)
    if session_config.voice_audio is not None and not plugin.capabilities().voice_upload:
        raise PluginError("voice_upload_unsupported",
                          f"plugin '{plugin.id}' takes no uploaded voice recordings",
                          param="voice_audio")
    runtime_config = await plugin.prepare_runtime_config(session_config)
    return PreparedConfig(session_config, runtime_config, record_allowed)


@dataclass(frozen=True)
class LegCapabilities:
    """What a leg's transport can do beyond carrying audio. Routes ask this, never the leg's
    class: a new transport says here what it can, and no route changes."""

    realtime_session: bool = False  # a Realtime session of its own (`describe_session`)
    dtmf: bool = False  # RFC 4733 telephone-events on its stream (`send_dtmf`)
    ice_restart: bool = False  # ICE: trickle, restarts, re-offers (`ice_generation`)
    refer: bool = False  # a SIP dialog it can be transferred out of (REFER)


class Leg:
    transport: ClassVar[str] = "leg"  # the metrics label: webrtc, media-stream, rtp
    can: ClassVar[LegCapabilities] = LegCapabilities()  # (the plugin's: `capabilities`)

    def __init__(self, leg_id: str, plugin: Plugin, ticker: Ticker, settings: CallSettings,
                 on_closed: Callable[[Leg], None]) -> None:
        """`on_closed` is told once the teardown is done (the agent's registry forgets the
        leg there)."""
        self.id = leg_id
        self.plugin = plugin
        self.ticker = ticker
        self.settings = settings
        self._on_closed = on_closed
        self.capabilities = plugin.capabilities()
        rate = self.capabilities.sample_rate
        self.playout = PlayoutBuffer(int(rate * settings.playout_capacity_seconds))
        # No re-chunking: the ticker cuts its frames from whatever arrived, so a packet is
        # not held back until the resampler's filter delay is filled by the next one.
        self.assembler = FrameAssembler(rate, None, self.capabilities.channels)
        self.slot: PluginSlot | None = None
        self.session_config = SessionConfig()
        self.recorder: CallRecorder | None = None
        # Set by signaling: the credential that may read, change and end this leg.
        self.owner: object | None = None
        # Recent session events (errors, DTMF, transcripts), for stats and observers.
        self.events: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        # Observers of the events over GET /v1/realtime?call_id= (realtime/sideband.py).
        self.sidebands = SidebandHub(self)
        self.watchdog = Watchdog(settings)
        self.end_reason: Ending | None = None
        self.ending_reason: Ending | None = None  # set while the caller is told why it ends
        self.queued_samples = 0  # agent samples ever put in the playout buffer
        self.pacer: Pacer | None = None  # the transport's outbound pacing, where it has one
        self.closed = asyncio.Event()
        self.tasks = TaskOwner(leg_id)  # cancelled when the leg closes
        self.closing = False
        self._close_task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def open_plugin_slot(self, prepared: PreparedConfig) -> None:
        """Take a ticker seat for a prepared config (AgentError if refused; the config is
        given back to the plugin then); start the recording unless the server does not record
        or the caller opted out."""
        try:
            if self.closing:
                raise AgentError("session_closed", "the session ended during setup")
            slot = await self.ticker.open_slot(
                prepared.runtime_config, self.on_output, self.on_plugin_error
            )
        except BaseException:
            self.plugin.discard_runtime_config(prepared.runtime_config)
            raise
        if self.closing:  # closed while the seat was being made
            await self.ticker.close_slot(slot)
            raise AgentError("session_closed", "the session ended during setup")
        self.slot = slot
        self.session_config = prepared.session_config
        self.recorder = recorder_for(self.settings.record_dir, prepared.record_allowed, self.id,
                                     self.capabilities.sample_rate, self.settings.record_format,
                                     self.settings.record_limits)
        if self.recorder is not None:
            slot.tap = self.recorder.add_tick

    def start_watchdog(self) -> None:
        self.tasks.spawn(self._watch(), "watchdog")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL)
            reason = self.watchdog.verdict(time.monotonic())
            if reason == EndReason.MAX_CALL_SECONDS:
                await self.on_time_limit(self.settings.max_call_seconds)
                return
            if reason is not None:
                await self.close(reason)
                return

    async def on_time_limit(self, limit: float) -> None:
        await self.close(EndReason.MAX_CALL_SECONDS)

    async def end_with_notice(self, reason: Ending, message: str | None = None) -> None:
        """End the leg, first telling the caller why where its transport can (see
        `notify_ending`). Without a message the caller was already told (an error event
        emitted just before), and that event is given the same time to leave."""
        if self.closing:
            return
        # The caller, told, may hang up during the notice: the call still ended for `reason`.
        self.ending_reason = reason
        if message is None or self.notify_ending(reason, message):
            await asyncio.sleep(NOTICE_SECONDS)
        await self.close(reason)

    def notify_ending(self, reason: Ending, message: str) -> bool:
        """Tell the caller the leg is about to end; True if something was sent."""
        return False

    async def close(self, reason: Ending = EndReason.HANGUP) -> None:
        """End the leg (idempotent). The teardown runs in its own task, so a caller that is
        cancelled meanwhile (an HTTP or websocket handler, one of the leg's own tasks) cannot
        cut it short."""
        if self._close_task is None:
            reason = self.ending_reason or reason
            self.closing = True
            self.end_reason = reason
            self.sidebands.end(reason)
            self._close_task = asyncio.ensure_future(self._teardown(reason))
        await asyncio.shield(self._close_task)

    async def _teardown(self, reason: Ending) -> None:
        self.tasks.cancel_all()
        try:
            if self.slot is not None:
                await self.ticker.close_slot(self.slot)
        except Exception:
            # A plugin failing here must not leave the leg registered with its transport open.
            log.exception("%s: closing the plugin session failed", self.id)
        if self.recorder is not None:
            await self.recorder.close()
        try:
            await self.close_transport(reason)
        except Exception as exc:
            log.warning("%s: closing the transport: %r", self.id, exc)
        self.assembler.close()
        self.closed.set()
        self._on_closed(self)

    async def close_transport(self, reason: Ending) -> None:
        """Release the transport's sockets and codecs; transports override."""

    # -- media ------------------------------------------------------------------------------

    def push_caller_audio(self, frames: Iterable[np.ndarray]) -> None:
        """Caller audio at the plugin's rate (from `assembler`) into the plugin slot."""
        if self.slot is None:
            return
        for frame in frames:
            self.slot.push(frame)

    def on_output(self, output: StepOutput) -> None:
        """One step's answer (ticker, event loop)."""
        if output.error is not None:
            self.emit(error_event_from(output.error))
        reason = output.end_reason
        if reason is not None and not self.closing:
            self.tasks.spawn(self.end_with_notice(reason), "plugin-end")
        audio = output.mono_audio()
        self.playout.push(audio)
        self.queued_samples += len(audio)
        self.after_output(output, audio)
        self.sidebands.on_output(output, audio)

    def after_output(self, output: StepOutput, audio: np.ndarray) -> None:
        """A transport's or protocol's look at each step's answer (transcripts, speech)."""

    def on_plugin_error(self, exc: Exception) -> None:
        if isinstance(exc, AgentError):
            self.emit(error_event_from(exc))
        else:
            self.emit(
                error_event("plugin_error", "the model failed to step", error_type="server_error")
            )

    # -- events -----------------------------------------------------------------------------

    def emit(self, event: dict[str, Any]) -> None:
        """A session event for the caller: kept, recorded, and delivered by the transport."""
        self.events.append(event)
        if self.recorder is not None:
            self.recorder.add_event(event)
        self.deliver(event)
        self.sidebands.publish(event)

    def deliver(self, event: dict[str, Any]) -> None:
        """Send an event where the transport's protocol has a place for it."""

    # -- what some transports can do (`can`) -------------------------------------------------

    def describe_session(self) -> dict[str, Any]:
        """The Realtime session the transport speaks itself (`can.realtime_session`)."""
        raise CallError("no_realtime_session", "this call has no session of its own",
                        status=409)

    def send_dtmf(self, digits: str) -> int:
        """Queue keypad digits as telephone-events (`can.dtmf`); how many wait to be sent."""
        raise CallError("dtmf_not_negotiated", "DTMF is sent on RTP and SIP calls only",
                        status=409)

    @property
    def ice_generation(self) -> int:
        """How many ICE restarts this call has begun (`can.ice_restart`; else 0)."""
        return 0

    # -- reporting --------------------------------------------------------------------------

    def outbound_counts(self) -> tuple[int, int]:
        """(20 ms packets sent, encoded payload bytes sent); transports override."""
        return 0, 0

    def stats(self) -> dict[str, Any]:
        return {
            "call_id": self.id,
            "plugin": self.plugin.id,
            "age_s": round(time.monotonic() - self.watchdog.started_at, 3),
            "inbound": self.slot.counters.to_dict() if self.slot else None,
        }


def media_counts(leg: Leg) -> dict[str, int]:
    """Outbound and playout counters of a live or ended leg, for the metrics."""
    inbound = leg.slot.counters if leg.slot is not None else None
    packets, payload_bytes = leg.outbound_counts()
    return {
        "packets": packets,
        "bytes": payload_bytes,
        "underruns": leg.playout.underrun_chunks,
        "late_packets": leg.pacer.late_sends if leg.pacer is not None else 0,
        "trimmed_samples": leg.playout.trimmed_samples,
        "fifo_trimmed_samples": (inbound.dropped_backlog_samples
                                 + inbound.dropped_overflow_samples) if inbound else 0,
    }


def playout_stats(leg: Leg, reanchors: int) -> dict[str, Any]:
    rate = leg.capabilities.sample_rate
    return {
        "buffered_ms": round(leg.playout.buffered_samples / rate * 1000, 1),
        "dropped_samples": leg.playout.dropped_samples,
        "underrun_chunks": leg.playout.underrun_chunks,
        "reanchors": reanchors,
        "trimmed_ms": round(leg.playout.trimmed_samples / rate * 1000, 1),
    }
