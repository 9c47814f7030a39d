"""Latency numbers for one remote call: upstream round trip and the agent's own added delay.

Definitions (all per 80 ms frame):
- upstream round trip: the moment input frame k left on the websocket → the moment the
  upstream's k-th output frame was complete (duplex engines emit one frame per input frame,
  so the k-th output answers the k-th input).
- agent input hold: the ticker handed frame k to the plugin → it left on the websocket.
- agent output hold: output frame k was complete → the ticker took it for playout.
Their sum of holds is what the agent adds on top of the engine and the network.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

WINDOW = 512


class LatencyWindow:
    """The last `WINDOW` samples of one delay, in milliseconds (one writer thread)."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=WINDOW)
        self.count = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds * 1000.0)
        self.count += 1

    def summary(self) -> dict[str, Any]:
        values = np.array(list(self.samples), dtype=np.float64)
        if values.size == 0:
            return {"count": 0}
        return {
            "count": self.count,
            "last_ms": round(float(values[-1]), 2),
            "mean_ms": round(float(values.mean()), 2),
            "p50_ms": round(float(np.percentile(values, 50)), 2),
            "p95_ms": round(float(np.percentile(values, 95)), 2),
            "max_ms": round(float(values.max()), 2),
        }


class LinkLatency:
    """Matches output frames to input frames by index as audio is sent and received."""

    def __init__(self, frame_size: int) -> None:
        self.frame_size = frame_size
        self.upstream_rtt = LatencyWindow()
        self.input_hold = LatencyWindow()  # written on the event loop
        self.output_hold = LatencyWindow()  # written on the ticker thread
        # Send times of input frames not yet answered (appended on the loop, read on the
        # ticker thread: deque append/popleft are atomic).
        self._sent_at: deque[float] = deque(maxlen=4096)
        self._received_samples = 0
        self._answered_frames = 0

    def frames_sent(self, frames: int, queued_at: float, sent_at: float) -> None:
        for _ in range(frames):
            self._sent_at.append(sent_at)
            self.input_hold.add(sent_at - queued_at)

    def samples_received(self, count: int, arrived_at: float,
                         on_rtt: Callable[[float], None] | None = None) -> None:
        """Count received output; every completed frame answers the oldest unanswered input."""
        self._received_samples += count
        while self._received_samples >= (self._answered_frames + 1) * self.frame_size:
            self._answered_frames += 1
            if self._sent_at:
                rtt = max(0.0, arrived_at - self._sent_at.popleft())
                self.upstream_rtt.add(rtt)
                if on_rtt is not None:
                    on_rtt(rtt)

    def summary(self) -> dict[str, Any]:
        input_hold = self.input_hold.summary()
        output_hold = self.output_hold.summary()
        added = None
        if input_hold["count"] and output_hold["count"]:
            added = round(input_hold["mean_ms"] + output_hold["mean_ms"], 2)
        return {
            "upstream_rtt": self.upstream_rtt.summary(),
            "agent_input_hold": input_hold,
            "agent_output_hold": output_hold,
            "agent_added_mean_ms": added,
        }
