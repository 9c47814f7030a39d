"""Sidebands: observers of one leg's Realtime events that may also steer it, whatever carries
the call's audio (WebRTC, the media-stream websocket, plain RTP, SIP).

Every leg keeps a `SidebandHub`. Each event the leg emits (`Leg.emit`) is fanned out to every
attached `Sideband`'s own bounded queue, which never blocks the call: a sideband that falls
`QUEUE_LIMIT` events behind is dropped (`overflowed`) and the call and the other sidebands go
on. A sideband is greeted with `session.created` describing the current session; when the
leg ends every sideband gets `call.ending` with the reason (once, also where the transport
already sent it) and is finished. Client events a sideband sends (`session.update`,
`response.cancel`, `output_audio_buffer.clear`) go through their own rate-limited inbox and
the same validation and handling as the data channel's (`RealtimeProtocol.dispatch`); a bad
one is answered with an `error` on that sideband only.

Where the leg speaks the protocol itself (WebRTC: `speak_with`), the hub uses that protocol,
so a sideband's `session.update` and the data channel's share one lock and one session. A
leg without one (telephony) gets a protocol from the hub when the first sideband attaches:
from then on its answers also produce the transcript and speech events.

The queues are our own (a deque and an event per sideband): what is needed is a drop-on-
overflow fan-out with no awaiting on the sending side, a few lines over asyncio.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.end_reason import Ending, EndReason
from agent.errors import AgentError
from agent.realtime.client_inbox import ClientEventInbox, RawEvent
from agent.realtime.events import (
    error_event,
    error_event_from,
    parse_client_event,
    peek_event_id,
    server_event,
)
from agent.realtime.protocol import RealtimeLeg, RealtimeProtocol

if TYPE_CHECKING:
    import numpy as np

    from agent.plugins.base import StepOutput

log = logging.getLogger(__name__)

QUEUE_LIMIT = 256  # events waiting for one sideband before it is dropped
ENDING_EVENT = "call.ending"

# Why a sideband finished: the call ended (a normal close), it could not keep up, or its
# observer left.
CALL_ENDED = "call_ended"
OVERFLOWED = "sideband_overflow"
CLOSED = "closed"  # the observer went away


class Sideband:
    """One observer's queue of server events and its inbox of client events."""

    def __init__(self, hub: SidebandHub, limit: int = QUEUE_LIMIT) -> None:
        self._hub = hub
        self.limit = limit
        self._queue: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()
        self.finished: str | None = None  # CALL_ENDED, OVERFLOWED or CLOSED once finished
        settings = hub.leg.settings
        self.inbox = ClientEventInbox(
            self._handle, self._refuse, rate=settings.client_event_rate,
            burst=settings.client_event_burst)
        self._serving: asyncio.Task[None] | None = None
        # Told when the sideband is dropped for overflow (its sender may be stuck writing).
        self.on_overflow: Callable[[], None] | None = None

    # -- server events ----------------------------------------------------------------------

    def put(self, event: dict[str, Any]) -> None:
        """Queue one event (never blocks); over the limit the sideband is dropped."""
        if self.finished is not None:
            return
        if len(self._queue) >= self.limit:
            self._queue.clear()
            self._finish(OVERFLOWED)
            return
        self._queue.append(event)
        self._ready.set()

    async def next_event(self) -> dict[str, Any] | None:
        """The next event to send; None once finished (a call that ended still has its
        queued events, `call.ending` last, handed out first)."""
        while not self._queue:
            if self.finished is not None:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._queue.popleft()

    def _finish(self, why: str) -> None:
        if self.finished is None:
            self.finished = why
            self._ready.set()
            self._hub.detach(self)
            if why == OVERFLOWED and self.on_overflow is not None:
                self.on_overflow()

    def end(self) -> None:
        """The call ended: what is queued still goes out, then the sideband is done."""
        self._finish(CALL_ENDED)

    # -- client events ----------------------------------------------------------------------

    def offer(self, raw: RawEvent) -> None:
        """A client event from this sideband (never blocks; refused over the rate)."""
        if self.finished is not None:
            return
        if self._serving is None:
            self._serving = self._hub.leg.tasks.spawn(self.inbox.serve(), "sideband-events")
        self.inbox.offer(raw)

    async def _handle(self, raw: RawEvent) -> None:
        client_event_id = None
        try:
            event = parse_client_event(raw)
            client_event_id = event.get("event_id")
            await self._hub.protocol.dispatch(event)
        except AgentError as exc:
            self.put(error_event_from(exc, client_event_id or peek_event_id(raw)))
        except Exception:
            log.exception("call %s: sideband client event failed", self._hub.leg.id)
            self.put(error_event("server_error", "the event could not be handled",
                                 client_event_id=client_event_id, error_type="server_error"))

    def _refuse(self, raw: RawEvent, count: int) -> None:
        settings = self._hub.leg.settings
        self.put(error_event(
            "rate_limited",
            f"{count} client event(s) refused: at most {settings.client_event_rate:g} "
            f"a second (bursts of {settings.client_event_burst})",
            client_event_id=peek_event_id(raw)))

    def close(self) -> None:
        """The observer went away: stop its inbox and forget it."""
        if self._serving is not None:
            self._serving.cancel()
            self._serving = None
        if self.finished is None:
            self.finished = CLOSED
            self._hub.detach(self)


class SidebandHub:
    """The sidebands of one leg, and the protocol that speaks for it to them."""

    def __init__(self, leg: RealtimeLeg) -> None:
        self.leg = leg
        self.sidebands: list[Sideband] = []
        self._protocol: RealtimeProtocol | None = None
        self._own_protocol = False  # made here: its answers' events are the hub's to make
        self._ending_sent = False
        self.ended = False
        self.overflows = 0

    def speak_with(self, protocol: RealtimeProtocol) -> None:
        """The leg's own protocol (WebRTC's data channel): sidebands share it."""
        self._protocol = protocol
        self._own_protocol = False

    @property
    def protocol(self) -> RealtimeProtocol:
        if self._protocol is None:
            self._protocol = RealtimeProtocol(self.leg)
            self._own_protocol = True
        return self._protocol

    def attach(self, limit: int = QUEUE_LIMIT) -> Sideband:
        """A new observer, greeted with the current session (and told at once if the call
        already ended)."""
        sideband = Sideband(self, limit)
        sideband.put(server_event("session.created", session=self.protocol.describe_session()))
        if self.ended:
            sideband.put(server_event(ENDING_EVENT, reason=self._ending_reason(),
                                      message="the call has ended"))
            sideband.end()
            return sideband
        self.sidebands.append(sideband)
        return sideband

    def detach(self, sideband: Sideband) -> None:
        if sideband in self.sidebands:
            self.sidebands.remove(sideband)
            if sideband.finished == OVERFLOWED:
                self.overflows += 1
                log.warning("call %s: a sideband fell %d events behind and was dropped",
                            self.leg.id, sideband.limit)

    def publish(self, event: dict[str, Any]) -> None:
        """One event the leg emitted, to every sideband (never blocks)."""
        if event.get("type") == ENDING_EVENT:
            self._ending_sent = True
        for sideband in list(self.sidebands):
            sideband.put(event)

    def on_output(self, output: StepOutput, audio: np.ndarray) -> None:
        """Each step's answer: transcripts and speech events, where the hub speaks for a
        leg that has no protocol of its own and someone is listening."""
        if self._own_protocol and self._protocol is not None and self.sidebands:
            self._protocol.on_output(output, audio)

    def _ending_reason(self) -> Ending:
        reason: Ending | None = getattr(self.leg, "end_reason", None)
        return reason or EndReason.HANGUP

    def end(self, reason: Ending) -> None:
        """The leg is closing: `call.ending` (unless already sent), then every sideband is
        finished once its queue is sent."""
        if self.ended:
            return
        self.ended = True
        if not self._ending_sent:
            self.publish(server_event(ENDING_EVENT, reason=reason,
                                      message=f"the call ended ({reason})"))
        for sideband in list(self.sidebands):
            sideband.end()
