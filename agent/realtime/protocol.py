"""The OpenAI-Realtime event protocol over any message channel a leg has.

Server events: `session.created` / `session.updated`, `output_audio_buffer.started` /
`.stopped` / `.cleared` (the agent's speech, seen in its output), transcript deltas and
`done`, `error`, `call.ending`. Client events: `session.update`, `response.cancel` and
`output_audio_buffer.clear` (barge-in), rate limited, handled one at a time in order.
The leg owns the conversation; this adapter only speaks about it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agent.end_reason import Ending
from agent.errors import AgentError
from agent.plugins.base import Capabilities, Plugin, SessionConfig, StepOutput
from agent.realtime.client_inbox import ClientEventInbox, RawEvent
from agent.realtime.events import (
    MAX_CLIENT_EVENT_BYTES,
    EventChannel,
    Send,
    error_event,
    error_event_from,
    parse_client_event,
    peek_event_id,
    server_event,
)
from agent.realtime.session_config import session_config_from_realtime
from agent.recording import take_record_option

if TYPE_CHECKING:
    from agent.audio.playout import PlayoutBuffer
    from agent.call_settings import CallSettings
    from agent.task_owner import TaskOwner
    from agent.ticker import PluginSlot, Ticker

log = logging.getLogger(__name__)

SPEECH_RMS = 1e-3  # about -60 dBFS: quieter output frames count as silence
SPEECH_HANGOVER_FRAMES = 6  # silent frames before the agent counts as having stopped


class RealtimeLeg(Protocol):
    """What the protocol reads and drives of the leg it speaks for (agent/leg.py's `Leg`)."""

    id: str
    plugin: Plugin
    ticker: Ticker
    settings: CallSettings
    capabilities: Capabilities
    slot: PluginSlot | None
    session_config: SessionConfig
    playout: PlayoutBuffer
    tasks: TaskOwner

    def emit(self, event: dict[str, Any]) -> None:
        """A session event for the caller."""


class RealtimeProtocol:
    def __init__(self, leg: RealtimeLeg) -> None:
        self.leg = leg
        self.channel = EventChannel()
        settings = leg.settings
        self.inbox = ClientEventInbox(
            self.handle_client_event, self._refuse_client_events,
            rate=settings.client_event_rate, burst=settings.client_event_burst,
        )
        self._served: asyncio.Task[None] | None = None
        self._update_lock = asyncio.Lock()
        self._speaking = False
        self._silent_frames = 0
        self._transcript: list[str] = []
        self._response_index = 0

    # -- the channel ------------------------------------------------------------------------

    def attach(self, send: Send) -> None:
        """A message channel opened: greet it; client messages go to `inbox.offer`."""
        self.channel.attach(send)
        if self._served is None:  # one consumer keeps events in order
            self._served = self.leg.tasks.spawn(self.inbox.serve(), "client-events")
        self.leg.emit(server_event("session.created", session=self.describe_session()))

    def detach(self) -> None:
        self.channel.detach()

    def describe_session(self) -> dict[str, Any]:
        leg = self.leg
        config = leg.slot.config if leg.slot is not None else None
        described = config.describe() if config is not None else {}
        return {
            "type": "realtime",
            "id": leg.id,
            "object": "realtime.session",
            "model": leg.plugin.id,
            "plugin": leg.plugin.id,
            **described,
            # Where OpenAI Realtime clients read the voice.
            "audio": {"output": {"voice": described.get("voice")}},
            "capabilities": leg.capabilities.to_dict(),
        }

    # -- what the agent says ----------------------------------------------------------------

    @property
    def response_id(self) -> str:
        return f"resp_{self.leg.id[5:17]}_{self._response_index}"

    def on_output(self, output: StepOutput, audio: np.ndarray) -> None:
        self._track_speech(audio)
        if output.text:
            self._transcript.append(output.text)
            self.leg.emit(server_event(
                "response.output_audio_transcript.delta",
                response_id=self.response_id, item_id=self.response_id,
                output_index=0, content_index=0, delta=output.text,
            ))
        if output.segment_end:
            self._finish_transcript()

    def _track_speech(self, audio: np.ndarray) -> None:
        # RMS by one dot product: a sixth of mean(square()) for every call's every frame.
        flat = audio.reshape(-1)
        loud = bool(flat.size) and (float(np.dot(flat, flat)) / flat.size) ** 0.5 > SPEECH_RMS
        if loud:
            self._silent_frames = 0
            if not self._speaking:
                self._speaking = True
                self.leg.emit(
                    server_event("output_audio_buffer.started", response_id=self.response_id)
                )
        elif self._speaking:
            self._silent_frames += 1
            if self._silent_frames >= SPEECH_HANGOVER_FRAMES:
                self._speaking = False
                self._finish_transcript()
                self.leg.emit(
                    server_event("output_audio_buffer.stopped", response_id=self.response_id)
                )
                self._response_index += 1

    def _finish_transcript(self) -> None:
        if not self._transcript:
            return
        text = "".join(self._transcript)
        self._transcript.clear()
        self.leg.emit(server_event(
            "response.output_audio_transcript.done",
            response_id=self.response_id, item_id=self.response_id,
            output_index=0, content_index=0, transcript=text,
        ))

    # -- what the caller asks ---------------------------------------------------------------

    def _refuse_client_events(self, raw: RawEvent, count: int) -> None:
        settings = self.leg.settings
        log.warning("call %s: %d client events refused over the rate limit", self.leg.id, count)
        self.leg.emit(error_event(
            "rate_limited",
            f"{count} client event(s) refused: at most {settings.client_event_rate:g} "
            f"a second (bursts of {settings.client_event_burst})",
            client_event_id=peek_event_id(raw),
        ))

    def refuse_oversized(self) -> None:
        """A message over the data channel's size limit was dropped as it arrived."""
        self.leg.emit(error_event("message_too_large",
                                  f"events are limited to {MAX_CLIENT_EVENT_BYTES // 1024} KiB"))

    async def handle_client_event(self, raw: RawEvent) -> None:
        client_event_id = None
        try:
            event = parse_client_event(raw)
            client_event_id = event.get("event_id")
            await self.dispatch(event)
        except AgentError as exc:
            self.leg.emit(error_event_from(exc, client_event_id or peek_event_id(raw)))
        except Exception:
            log.exception("call %s: client event failed", self.leg.id)
            self.leg.emit(
                error_event("server_error", "the event could not be handled",
                            client_event_id=client_event_id, error_type="server_error")
            )

    async def dispatch(self, event: dict[str, Any]) -> None:
        event_type = event["type"]
        if event_type == "session.update":
            await self.update_session(event.get("session"))
        elif event_type in ("response.cancel", "output_audio_buffer.clear"):
            await self.barge_in()
        else:
            raise AgentError(
                "unknown_event", f"unknown event type '{event_type}'", param="type"
            )

    async def update_session(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise AgentError("invalid_type", "'session' must be an object", param="session")
        # Recording is chosen when the leg starts; a later `record` is not the plugin's.
        update, _ = take_record_option(session_config_from_realtime(session))
        leg = self.leg
        async with self._update_lock:
            if leg.slot is None:
                raise AgentError("session_not_ready", "the session is not open yet")
            new_config = leg.plugin.runtime_config_for_update(leg.slot.config, update)
            await leg.ticker.update_slot(leg.slot, new_config)
            leg.session_config = leg.session_config.merged(update)
        self.leg.emit(server_event("session.updated", session=self.describe_session()))

    async def barge_in(self) -> None:
        """Drop queued agent audio and restart the model from its prompt."""
        leg = self.leg
        dropped = leg.playout.clear()
        if leg.slot is not None:
            await leg.ticker.restart_slot(leg.slot)
        self._transcript.clear()
        if self._speaking:
            self._speaking = False
            self._response_index += 1
        self.leg.emit(server_event(
            "output_audio_buffer.cleared",
            response_id=self.response_id,
            dropped_ms=round(dropped / self.leg.capabilities.sample_rate * 1000),
        ))

    def notify_ending(self, reason: Ending, message: str) -> None:
        self.leg.emit(server_event("call.ending", reason=reason, message=message))
