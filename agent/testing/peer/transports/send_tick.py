"""One timer per event loop for everything the peer does on a pace: the 20 ms sends, the
reads of the polled sockets on the same wake-up, and 5 ms reads where asked for.

A call with a send task of its own wakes 50 times a second through asyncio's sleep (a timer
handle, a future, a task step): with tens of calls in one peer process those wake-ups are a
large part of what a call costs the peer, and a load test should measure the agent, not its
callers. Here every RTP stream (rtp and sip), load-test WebRTC call (direct_srtp.py) and
media-stream call of the loop joins one `PeerTick` (`join`), so one wake-up every 20 ms
sends for all of them, and the RTP streams' sockets are read on the same tick; each call
keeps its own `Pacer` (`Pacer.take_due`), so its send times, catch-up after a short stall and
restart after a long one are those of a task of its own. The polled stream connections
(receive_poll.py) are read on the send tick too, and after a burst every 5 ms for a while
(`join_poll`), on the same grid: every fourth read is the send tick's wake-up, not one of
its own.

Why not the agent's `SendClock` (agent/audio/send_clock.py): that one is a task sleeping
between ticks, and each of its ticks takes two passes of the event loop (the sleep's timer
sets a future, the task's step is scheduled, then runs) where a timer's callback takes one;
it spreads its senders over phases, which the peer, after the fewest wake-ups, does not
want; and it runs the ticks it missed back to back, where a late wake-up here runs once,
the senders given the latest send time passed (their pacers send every packet due by then,
as the missed ticks would have) and the polls reading once (one read takes all that waits).
On the 2-core development VM a wake-up after a sleep costs 30-75 µs however little it
does: 3-4 ms of CPU a second at 50 wake-ups, a fifth of what the peer spends on eight RTP
calls.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from itertools import count

from agent.audio.pcm import PTIME
from agent.testing.peer.transports.per_loop import PerLoop

log = logging.getLogger(__name__)

POLLS_PER_SEND = 4  # a read of the polled connections every 5 ms

# Called on each send tick: (the tick's grid time, the time now), both monotonic.
SendDue = Callable[[float, float], None]
Poll = Callable[[], None]


class PeerTick:
    """Senders (`join`) called every `period`, polls (`join_poll`) every `period` /
    `polls_per_send`, from one timer on a drift-free grid, running only while someone is
    joined."""

    def __init__(self, period: float = PTIME, polls_per_send: int = POLLS_PER_SEND) -> None:
        self.period = period
        self.polls_per_send = polls_per_send
        self.step_seconds = period / polls_per_send
        self._senders: dict[int, SendDue] = {}
        self._polls: dict[int, Poll] = {}
        self._keys = count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._due_step = 0  # the grid step the pending wake-up is for
        self._anchor = 0.0  # monotonic time of step 0
        self._starting = False  # started, its first wake-up (step 0) still to run
        self._waking = False  # inside a wake-up, which schedules the next one as it ends
        self._last_send_step = -1
        self.wakeups = 0
        self.failures = 0  # senders and polls dropped for raising
        self.late_max = 0.0  # the latest a wake-up ran after its step's time (seconds)

    def __len__(self) -> int:
        return len(self._senders) + len(self._polls)

    def senders(self) -> int:
        return len(self._senders)

    def polls(self) -> int:
        return len(self._polls)

    def join(self, send_due: SendDue) -> Callable[[], None]:
        """Call `send_due(tick_at, now)` on every send tick from now on; returns the call that
        stops it (safe to call more than once). Senders run in the order they joined, after
        the polls of the same wake-up."""
        return self._add(self._senders, send_due)

    def join_poll(self, poll: Poll) -> Callable[[], None]:
        """Call `poll()` every step (5 ms) from now on; returns the call that stops it."""
        leave = self._add(self._polls, poll)
        sooner = self._next_step(self._step_now())
        if self._handle is not None and not self._starting and self._due_step > sooner:
            self._schedule(sooner)  # the next step, not the next send tick
        return leave

    def _add(self, group: dict[int, Callable[..., None]],
             call: Callable[..., None]) -> Callable[[], None]:
        key = next(self._keys)
        group[key] = call
        self._start()

        def leave() -> None:
            group.pop(key, None)

        return leave

    def close(self) -> None:
        self._senders.clear()
        self._polls.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # -- the timer ------------------------------------------------------------------------

    def _start(self) -> None:
        # A member joining from inside a wake-up (a read that saw a burst asking for polls)
        # finds no pending handle, but the grid runs: the wake-up schedules the next one.
        if self._handle is not None or self._waking:
            return
        self._loop = asyncio.get_running_loop()
        self._starting = True  # the grid starts when the first wake-up runs (the loop may
        # be busy a while first: a grid started now would have its first sends catch up)
        self._last_send_step = -1
        self._due_step = 0
        self._handle = self._loop.call_soon(self._wake)

    def _step_now(self) -> int:
        # A wake-up comes at or after its step's time (the margin: float rounding).
        return math.floor((time.monotonic() - self._anchor) / self.step_seconds + 1e-6)

    def _next_step(self, after: int) -> int:
        """The next step after `after` that has work: every one while polls are joined, else
        the next send step."""
        if self._polls:
            return after + 1
        return (after // self.polls_per_send + 1) * self.polls_per_send

    def _schedule(self, step: int) -> None:
        assert self._loop is not None
        if self._handle is not None:
            self._handle.cancel()
        self._due_step = step
        delay = self._anchor + step * self.step_seconds - time.monotonic()
        self._handle = self._loop.call_later(max(0.0, delay), self._wake)

    def _wake(self) -> None:
        self._handle = None
        if not len(self):
            return
        if self._starting:
            self._starting = False
            self._anchor = time.monotonic()
        self.wakeups += 1
        self._waking = True
        try:
            step = self._run_members()
        finally:
            self._waking = False
        if len(self):
            self._schedule(self._next_step(step))

    def _run_members(self) -> int:
        """The polls, then the senders if a send tick passed; returns the step run."""
        step = max(self._step_now(), self._due_step)
        now = time.monotonic()
        late = now - (self._anchor + self._due_step * self.step_seconds)
        if late > self.late_max:
            self.late_max = late
        for key, poll in list(self._polls.items()):
            self._run(self._polls, key, poll)
        send_step = step - step % self.polls_per_send
        if send_step > self._last_send_step and self._senders:
            # The latest send tick passed: senders that missed some (a late wake-up) send
            # every packet due by then (their pacers count them).
            self._last_send_step = send_step
            tick_at = self._anchor + send_step * self.step_seconds
            for key, send_due in list(self._senders.items()):
                self._run(self._senders, key, send_due, tick_at, now)
        return step

    def _run(self, group: dict[int, Callable[..., None]], key: int,
             call: Callable[..., None], *args: float) -> None:
        try:
            call(*args)
        except Exception:  # one broken sender or reader must not stop the others
            log.exception("a call on the peer's tick failed; dropping it")
            self.failures += 1
            group.pop(key, None)


# The running loop's one.
send_tick = PerLoop(PeerTick)
