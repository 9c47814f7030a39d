"""One 20 ms tick per event loop for everything the peer sends on a pace.

A call with a send task of its own wakes 50 times a second through asyncio's sleep (a timer
handle, a future, a task step): with tens of calls in one peer process those wake-ups are a
large part of what a call costs the peer, and a load test should measure the agent, not its
callers. Here every RTP stream (rtp and sip), load-test WebRTC call (direct_srtp.py) and
media-stream call of the loop joins one `SendClock` (agent/audio/send_clock.py) with a single
phase, so one wake-up every 20 ms sends for all of them, and the RTP streams' sockets are read
on the same tick; each call keeps its own `Pacer` (`Pacer.take_due`), so its send times,
catch-up after a short stall and restart after a long one are those of a task of its own.
"""

from __future__ import annotations

from agent.audio.clock import MonotonicClock
from agent.audio.pcm import PTIME
from agent.audio.send_clock import SendClock
from agent.testing.peer.transports.per_loop import PerLoop

# The running loop's one 20 ms send clock (created on first use, one phase: the peer wants
# the fewest wake-ups, not the agent's load spread over phases).
send_tick = PerLoop(lambda: SendClock(MonotonicClock(), PTIME, phases=1))
