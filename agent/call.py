"""One call: a peer connection, its inbound reader, its ticker seat, its paced outbound track.

Follow one frame: the remote track's decoded audio → `FrameAssembler` (resample to the
plugin's rate) → `TickedSession.push` (the ticker cuts exact frames) → the ticker's batched
`plugin.step` → `on_output` →
`PlayoutBuffer` → `AgentAudioTrack.recv` (paced 20 ms) → the peer.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from .client_inbox import ClientEventInbox, RawEvent
from .clock import MonotonicClock
from .events import (
    EventChannel, error_event, error_event_from, parse_client_event, peek_event_id, server_event,
)
from .framing import FrameAssembler
from .outbound import AgentAudioTrack
from .playout import PlayoutBuffer
from .realtime_session import session_config_from_realtime
from .call_settings import CallSettings
from .errors import AgentError
from .rtc_tuning import InlineAudioDecoding
from .recording import CallRecorder, recorder_for, take_record_option
from .plugins.base import Plugin, SessionConfig, StepOutput
from .task_owner import TaskOwner
from .ticker import TickedSession, Ticker

log = logging.getLogger(__name__)

SPEECH_RMS = 1e-3  # about -60 dBFS: quieter output frames count as silence
SPEECH_HANGOVER_FRAMES = 6  # silent frames before the agent counts as having stopped


def new_call_id() -> str:
    return "call_" + secrets.token_urlsafe(18)




class Call:
    def __init__(
        self,
        call_id: str,
        pc: RTCPeerConnection,
        plugin: Plugin,
        ticker: Ticker,
        settings: CallSettings,
        on_closed: Callable[[Call], Awaitable[None] | None],
    ) -> None:
        self.id = call_id
        self.pc = pc
        self.plugin = plugin
        self.ticker = ticker
        self.settings = settings
        self.capabilities = plugin.capabilities()
        self.clock = MonotonicClock()
        self.playout = PlayoutBuffer(
            int(self.capabilities.sample_rate * settings.playout_capacity_seconds)
        )
        self.track = AgentAudioTrack(self.playout, self.capabilities.sample_rate)
        self.events = EventChannel()
        self.ticked: TickedSession | None = None
        self.recorder: CallRecorder | None = None
        self.inbound_decoding: InlineAudioDecoding | None = None  # None: aiortc decodes
        self.session_config = SessionConfig()
        self.started_at = time.monotonic()
        self.connected_at: float | None = None
        self.last_inbound_at: float | None = None
        self.end_reason: str | None = None
        self.codec: str | None = None
        self.closed = asyncio.Event()
        self.tasks = TaskOwner(call_id)
        self._on_closed = on_closed
        self._closing = False
        self._close_task: asyncio.Task[None] | None = None
        self._speaking = False
        self._silent_frames = 0
        self._transcript: list[str] = []
        self._response_index = 0
        self._update_lock = asyncio.Lock()
        self.client_events = ClientEventInbox(
            self.handle_client_event, self._refuse_client_events,
            rate=settings.client_event_rate, burst=settings.client_event_burst,
        )
        self._client_events_served: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Start a task this call owns: it is cancelled when the call closes."""
        return self.tasks.spawn(coro, name)

    def start_watchdog(self) -> None:
        self.spawn(self._watchdog(), "watchdog")

    async def _watchdog(self) -> None:
        interval = 0.25
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            if self.connected_at is None:
                if now - self.started_at > self.settings.connect_timeout:
                    await self.close("connect_timeout")
                    return
                continue
            since_audio = now - (self.last_inbound_at or self.connected_at)
            if since_audio > self.settings.idle_timeout:
                await self.close("idle_timeout")
                return
            max_seconds = self.settings.max_call_seconds
            if max_seconds and now - self.connected_at > max_seconds:
                # OpenAI's own clients recognise this error code as the session's hard end.
                self.events.send(
                    error_event("session_expired",
                                f"the call hit its maximum duration of {max_seconds:g} s")
                )
                await self.end_with_notice("max_call_seconds",
                                           f"calls are limited to {max_seconds:g} s")
                return

    async def end_with_notice(self, reason: str, message: str) -> None:
        """Tell the caller why (a `call.ending` event), give it a moment to leave, then end."""
        if self._closing:
            return
        self.events.send(server_event("call.ending", reason=reason, message=message))
        await asyncio.sleep(0.2)  # let the event leave before the channel closes
        await self.close(reason)

    def on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected" and self.connected_at is None:
            self.connected_at = time.monotonic()
        elif state in ("failed", "closed"):
            self.spawn(self.close(f"connection_{state}"), "close")

    async def close(self, reason: str = "hangup") -> None:
        """End the call (idempotent). The teardown runs in its own task, so a caller that is
        cancelled meanwhile (an HTTP handler, one of the call's own tasks) cannot cut it short."""
        if self._close_task is None:
            self._closing = True
            self.end_reason = reason
            self._close_task = asyncio.ensure_future(self._teardown())
        await asyncio.shield(self._close_task)

    async def _teardown(self) -> None:
        self.tasks.cancel_all()
        try:
            if self.ticked is not None:
                await self.ticker.close_session(self.ticked)
        except Exception:
            # A plugin failing here must not leave the call registered with its peer open.
            log.exception("call %s: closing the plugin session failed", self.id)
        if self.recorder is not None:
            await self.recorder.close()
        self.track.stop()
        try:
            # pc.close() can hang on a dead transport; never let it pin the call.
            await asyncio.wait_for(self.pc.close(), timeout=5)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("call %s: peer connection close: %r", self.id, exc)
        self.events.detach()
        self.closed.set()
        result = self._on_closed(self)
        if asyncio.iscoroutine(result):
            await result

    def start_recording(self, allowed: bool) -> None:
        """Record this call if the server records and the caller did not opt out (after the
        ticker seat is taken)."""
        self.recorder = recorder_for(self.settings.record_dir, allowed, self.id,
                                     self.capabilities.sample_rate)
        if self.recorder is not None and self.ticked is not None:
            self.ticked.tap = self.recorder.add_tick
            self.events.observer = self.recorder.add_event

    # -- media ------------------------------------------------------------------------------

    def on_remote_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.spawn(self._read_inbound(track), "inbound")
        else:
            self.spawn(self._drain(track), "drain")

    async def _read_inbound(self, track: MediaStreamTrack) -> None:
        capabilities = self.capabilities
        # No re-chunking here: the ticker cuts its frames from whatever has arrived, so a frame
        # is ready as soon as its last packet is decoded (a fixed chunk size would hold each
        # packet back until the resampler's filter delay is filled by the next one).
        assembler = FrameAssembler(capabilities.sample_rate, None, capabilities.channels)
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            self.last_inbound_at = time.monotonic()
            if self.ticked is None:
                continue
            for chunk in assembler.push(frame):
                self.ticked.push(chunk)

    async def _drain(self, track: MediaStreamTrack) -> None:
        # An unread track fills an unbounded queue inside aiortc.
        while True:
            try:
                await track.recv()
            except MediaStreamError:
                return

    def on_output(self, output: StepOutput) -> None:
        if output.error is not None:
            self.events.send(error_event_from(output.error))
        reason = output.end_reason
        if reason is not None and not self._closing:
            self.spawn(self._end_after_events(reason), "plugin-end")
        audio = output.mono_audio()
        self.playout.push(audio)
        self._track_speech(audio)
        if output.text:
            self._transcript.append(output.text)
            self.events.send(
                server_event(
                    "response.output_audio_transcript.delta",
                    response_id=self.response_id, item_id=self.response_id,
                    output_index=0, content_index=0, delta=output.text,
                )
            )
        if output.segment_end:
            self._finish_transcript()

    async def _end_after_events(self, reason: str) -> None:
        await asyncio.sleep(0.2)  # let the error event leave before the channel closes
        await self.close(reason)

    @property
    def response_id(self) -> str:
        return f"resp_{self.id[5:17]}_{self._response_index}"

    def _track_speech(self, audio: np.ndarray) -> None:
        loud = float(np.sqrt(np.mean(np.square(audio)))) > SPEECH_RMS if audio.size else False
        if loud:
            self._silent_frames = 0
            if not self._speaking:
                self._speaking = True
                self.events.send(
                    server_event("output_audio_buffer.started", response_id=self.response_id)
                )
        elif self._speaking:
            self._silent_frames += 1
            if self._silent_frames >= SPEECH_HANGOVER_FRAMES:
                self._speaking = False
                self._finish_transcript()
                self.events.send(
                    server_event("output_audio_buffer.stopped", response_id=self.response_id)
                )
                self._response_index += 1

    def _finish_transcript(self) -> None:
        if not self._transcript:
            return
        text = "".join(self._transcript)
        self._transcript.clear()
        self.events.send(
            server_event(
                "response.output_audio_transcript.done",
                response_id=self.response_id, item_id=self.response_id,
                output_index=0, content_index=0, transcript=text,
            )
        )

    def on_plugin_error(self, exc: Exception) -> None:
        if isinstance(exc, AgentError):
            self.events.send(error_event_from(exc))
        else:
            self.events.send(
                error_event("plugin_error", "the model failed to step", error_type="server_error")
            )

    # -- data channel -----------------------------------------------------------------------

    def describe_session(self) -> dict[str, Any]:
        config = self.ticked.config if self.ticked is not None else None
        described = config.describe() if config is not None else {}
        return {
            "type": "realtime",
            "id": self.id,
            "object": "realtime.session",
            "model": self.plugin.id,
            "plugin": self.plugin.id,
            **described,
            # Where OpenAI Realtime clients read the voice.
            "audio": {"output": {"voice": described.get("voice")}},
            "capabilities": self.capabilities.to_dict(),
        }

    def attach_channel(self, channel: RTCDataChannel) -> None:
        self.events.attach(channel.send)

        channel.on("message", self.client_events.offer)
        if self._client_events_served is None:  # one consumer keeps events in order
            self._client_events_served = self.spawn(self.client_events.serve(), "client-events")

        @channel.on("close")
        def on_close() -> None:
            self.events.detach()

        self.events.send(server_event("session.created", session=self.describe_session()))

    def _refuse_client_events(self, raw: RawEvent, count: int) -> None:
        log.warning("call %s: %d client events refused over the rate limit", self.id, count)
        self.events.send(error_event(
            "rate_limited",
            f"{count} client event(s) refused: at most {self.settings.client_event_rate:g} "
            f"a second (bursts of {self.settings.client_event_burst})",
            client_event_id=peek_event_id(raw),
        ))

    async def handle_client_event(self, raw: RawEvent) -> None:
        client_event_id = None
        try:
            event = parse_client_event(raw)
            client_event_id = event.get("event_id")
            await self.dispatch(event)
        except AgentError as exc:
            self.events.send(error_event_from(exc, client_event_id or peek_event_id(raw)))
        except Exception:
            log.exception("call %s: client event failed", self.id)
            self.events.send(
                error_event("server_error", "the event could not be handled",
                            client_event_id=client_event_id, error_type="server_error")
            )

    async def dispatch(self, event: dict[str, Any]) -> None:
        event_type = event["type"]
        if event_type == "session.update":
            await self.update_session(event.get("session"))
        elif event_type in ("response.cancel", "output_audio_buffer.clear"):
            await self.new_epoch()
        else:
            raise AgentError(
                "unknown_event", f"unknown event type '{event_type}'", param="type"
            )

    async def update_session(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise AgentError("invalid_type", "'session' must be an object", param="session")
        # Recording is chosen when the call starts; a later `record` is not the plugin's.
        update, _ = take_record_option(session_config_from_realtime(session))
        async with self._update_lock:
            if self.ticked is None:
                raise AgentError("session_not_ready", "the session is not open yet")
            new_config = self.plugin.runtime_config_for_update(self.ticked.config, update)
            await self.ticker.update_session(self.ticked, new_config)
            self.session_config = self.session_config.merged(update)
        self.events.send(server_event("session.updated", session=self.describe_session()))

    async def new_epoch(self) -> None:
        """Barge-in: drop queued agent audio and restart the model from its prompt."""
        dropped = self.playout.clear()
        if self.ticked is not None:
            await self.ticker.restart_session(self.ticked)
        self._transcript.clear()
        if self._speaking:
            self._speaking = False
            self._response_index += 1
        self.events.send(
            server_event(
                "output_audio_buffer.cleared",
                response_id=self.response_id,
                dropped_ms=round(dropped / self.capabilities.sample_rate * 1000),
            )
        )

    # -- reporting --------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "call_id": self.id,
            "plugin": self.plugin.id,
            "connection_state": self.pc.connectionState,
            "age_s": round(time.monotonic() - self.started_at, 3),
            "inbound": self.ticked.counters.to_dict() if self.ticked else None,
            "decode_errors": (self.inbound_decoding.decode_errors
                              if self.inbound_decoding is not None else None),
            "playout": {
                "buffered_ms": round(
                    self.playout.buffered_samples / self.capabilities.sample_rate * 1000, 1
                ),
                "dropped_samples": self.playout.dropped_samples,
                "underrun_chunks": self.playout.underrun_chunks,
                "reanchors": self.track.pacer.reanchors,
                "trimmed_ms": round(self.playout.trimmed_samples / self.capabilities.sample_rate * 1000, 1),
            },
            "plugin_session": self.ticked.plugin_session.stats() if self.ticked else None,
        }
