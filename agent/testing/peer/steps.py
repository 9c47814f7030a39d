"""Runs a script's steps on a live `PeerCall` and notes what happened at each.

Steps act in real time (audio queued, DTMF and events sent, waits for the agent's speech,
events or the end of the call); what they observed goes into a `StepTrace` per step. The
expectations are judged afterwards (`checks.py`), on the whole recording, so a measured
value comes from the offline speech edges rather than from the moment the runner noticed.

The online part is a `SpeechTracker` on the received audio, fed by a task this runner owns
and cancels.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from typing import Any

from agent.testing.peer.recording import Recording
from agent.testing.peer.script import Script, Step
from agent.testing.peer.transports.base import PeerCall, PeerError
from agent.testing.peer.vad import SpeechTracker

POLL = 0.01
TRANSCRIPT_EVENTS = ("response.output_audio_transcript.delta", "response.audio_transcript.delta",
                     "response.output_text.delta", "response.text.delta")
GRACE = 0.5  # extra wait after an expectation's window, so the offline edges are recorded
HEAR_MORE = 0.3  # after the agent is heard, so its speech is recorded past its onset


@dataclass
class StepTrace:
    step: Step
    start: float  # seconds since t0
    end: float | None = None
    error: str | None = None  # an action that could not be done: "code: message"
    observed: dict[str, Any] = field(default_factory=dict)


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def transcript_until(call: PeerCall, until: float | None = None) -> tuple[str, list[float]]:
    """The agent's transcript from its events (up to `until`), and each piece's time."""
    text, times = "", []
    for timed in call.events:
        if until is not None and timed.t > until:
            break
        event = timed.event
        if event.get("type") in TRANSCRIPT_EVENTS and isinstance(event.get("delta"), str):
            text += event["delta"]
            times.append(timed.t)
    return text, times


class ScriptRunner:
    def __init__(self, call: PeerCall, script: Script) -> None:
        self.call = call
        self.script = script
        self.tracker = SpeechTracker(call.rate)
        self.traces: list[StepTrace] = []
        self._fed = 0  # chunks of call.received fed to the tracker
        self._feeder: asyncio.Task[None] | None = None

    # -- online speech ------------------------------------------------------------------

    def _feed(self) -> None:
        received: Recording = self.call.received
        while self._fed < len(received.chunks):
            self.tracker.feed(received.chunks[self._fed])
            self._fed += 1

    async def _feed_forever(self) -> None:
        while True:
            self._feed()
            await asyncio.sleep(POLL * 2)

    def _to_t0(self, seconds_into_received: float) -> float:
        start = self.call.received.start_time()
        return seconds_into_received + (start or 0.0)

    def agent_speaking_since(self, since: float) -> float | None:
        """When the agent started the speech it is in (even before `since`, t0 seconds), or
        its first onset after `since`; None when it has not spoken since."""
        self._feed()
        if self.tracker.speaking:
            return self._to_t0(self.tracker.onsets[-1])
        for onset in self.tracker.onsets:
            if self._to_t0(onset) >= since:
                return self._to_t0(onset)
        return None

    # -- running -----------------------------------------------------------------------

    async def run(self) -> list[StepTrace]:
        self._feeder = asyncio.ensure_future(self._feed_forever())
        try:
            for step in self.script.steps:
                trace = StepTrace(step, self.call.now())
                self.traces.append(trace)
                if self.call.ended.is_set() and step.kind != "expect_hangup":
                    trace.error = ("closed: the call ended before this step "
                                   f"({self.call.end_reason})")
                else:
                    try:
                        await getattr(self, f"_{step.kind}")(step, trace)
                    except PeerError as exc:
                        trace.error = f"{exc.code}: {exc.message}"
                trace.end = self.call.now()
        finally:
            self._feeder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feeder
            self._feed()
        return self.traces

    async def _sleep(self, seconds: float) -> None:
        """Sleep, cut short when the call ends."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.call.ended.wait(), max(0.0, seconds))

    async def _play_out(self) -> None:
        while self.call.playing() and not self.call.ended.is_set():
            await asyncio.sleep(POLL)

    async def _play(self, step: Step, trace: StepTrace) -> None:
        assert step.audio is not None
        self.call.play(step.audio)
        await self._play_out()

    _say = _play

    async def _silence(self, step: Step, trace: StepTrace) -> None:
        await self._sleep(float(step.args.get("value", 0.0)))

    async def _expect_speech(self, step: Step, trace: StepTrace) -> None:
        within = float(step.args.get("within", 1.5))
        deadline = trace.start + within + GRACE
        while self.call.now() < deadline and not self.call.ended.is_set():
            heard = self.agent_speaking_since(trace.start)
            if heard is not None:
                trace.observed["heard_at"] = heard
                # Hear a little more of it: the offline edges need more than its first frames
                # (and a call hung up right after would cut the speech to a click).
                await self._sleep(heard + HEAR_MORE - self.call.now())
                return
            await asyncio.sleep(POLL)

    async def _barge_in(self, step: Step, trace: StepTrace) -> None:
        assert step.audio is not None
        wait = float(step.args.get("wait_for_speech", 5.0))
        after = float(step.args.get("after_speech_starts", 0.3))
        deadline = trace.start + wait
        onset = None
        while onset is None and self.call.now() < deadline and not self.call.ended.is_set():
            onset = self.agent_speaking_since(trace.start)
            if onset is None:
                await asyncio.sleep(POLL)
        if onset is None:
            trace.observed["no_speech"] = True
            return
        trace.observed["agent_onset_online"] = onset
        await self._sleep(onset + after - self.call.now())
        trace.observed["barge_at"] = self.call.now()
        self.call.play(step.audio)
        await self._play_out()
        stop_within = float(step.args.get("expect_stop_within_ms", 400)) / 1000
        # Listen long enough after the barge-in to see whether the agent stopped.
        await self._sleep(trace.observed["barge_at"] + stop_within + GRACE - self.call.now())

    async def _dtmf(self, step: Step, trace: StepTrace) -> None:
        await self.call.send_dtmf(str(step.args["value"]))

    async def _session_update(self, step: Step, trace: StepTrace) -> None:
        await self.call.send_event({"type": "session.update", "session": step.args})

    async def _expect_event(self, step: Step, trace: StepTrace) -> None:
        wanted = str(step.args["type"])
        within = float(step.args.get("within", 5.0))
        timed = await self.call.wait_event(lambda event: event.get("type") == wanted, within,
                                           since=trace.start)
        if timed is not None:
            trace.observed["event_at"] = timed.t

    async def _expect_transcript(self, step: Step, trace: StepTrace) -> None:
        phrase = normalise(str(step.args["contains"]))
        within = float(step.args.get("within", 5.0))
        deadline = trace.start + within
        while True:
            text, times = transcript_until(self.call)
            if phrase in normalise(text):
                # The piece that completed the phrase: the earliest prefix that holds it.
                at = times[-1] if times else self.call.now()
                for count in range(1, len(times) + 1):
                    if phrase in normalise(transcript_until(self.call, times[count - 1])[0]):
                        at = times[count - 1]
                        break
                trace.observed["found_at"] = at
                return
            if self.call.now() >= deadline or self.call.ended.is_set():
                trace.observed["transcript"] = text
                return
            await asyncio.sleep(POLL * 2)

    async def _hangup(self, step: Step, trace: StepTrace) -> None:
        await self.call.hangup()
        trace.observed["hung_up"] = True

    async def _expect_hangup(self, step: Step, trace: StepTrace) -> None:
        within = float(step.args.get("within", 10.0))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.call.ended.wait(), within)
        if self.call.ended.is_set():
            trace.observed["ended_at"] = self.call.now()
            trace.observed["end_reason"] = self.call.end_reason
