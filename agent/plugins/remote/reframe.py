"""Remote audio arrives in chunks of any size; the ticker needs exact frames."""

from __future__ import annotations

from collections import deque

import numpy as np

# Ticks in a row that end with a whole frame still waiting before one frame is dropped.
BACKLOG_PATIENCE_TICKS = 12


class Reframer:
    """Float32 samples in, exact `frame_size` frames out, oldest dropped past `max_frames`.

    The ticker pops one frame per tick. Engine output arrives with jitter: a frame that
    misses its tick is replaced by silence there, and everything after it would then play one
    frame late for the rest of the call. So a backlog that stands for
    `BACKLOG_PATIENCE_TICKS` ticks in a row is trimmed by one frame (oldest first), the same
    policy the ticker applies to caller audio.

    Each frame remembers when its last sample arrived, so the caller can measure how long it
    waited here.
    """

    def __init__(self, frame_size: int, max_frames: int,
                 patience_ticks: int = BACKLOG_PATIENCE_TICKS) -> None:
        self.frame_size = frame_size
        self.max_frames = max_frames
        self.patience_ticks = patience_ticks
        self._frames: deque[tuple[np.ndarray, float]] = deque()
        self._partial = np.zeros(0, dtype=np.float32)
        self._backlog_ticks = 0
        self.dropped_frames = 0
        self.trimmed_frames = 0

    @property
    def buffered_frames(self) -> int:
        return len(self._frames)

    def push(self, samples: np.ndarray, arrived_at: float) -> None:
        data = np.concatenate([self._partial, samples.astype(np.float32, copy=False)])
        whole = len(data) // self.frame_size * self.frame_size
        for start in range(0, whole, self.frame_size):
            self._frames.append((data[start : start + self.frame_size].copy(), arrived_at))
        self._partial = data[whole:].copy()
        while len(self._frames) > self.max_frames:
            self._frames.popleft()
            self.dropped_frames += 1

    def pop(self) -> tuple[np.ndarray, float] | None:
        """The frame for this tick (None: play silence), trimming a standing backlog."""
        if not self._frames:
            self._backlog_ticks = 0
            return None
        frame = self._frames.popleft()
        if not self._frames:
            self._backlog_ticks = 0
            return frame
        self._backlog_ticks += 1
        if self._backlog_ticks >= self.patience_ticks:
            self._backlog_ticks = 0
            self.trimmed_frames += 1
            return self._frames.popleft()  # skip one: the late frame goes, the next plays
        return frame

    def clear(self) -> int:
        dropped = len(self._frames) * self.frame_size + len(self._partial)
        self._frames.clear()
        self._partial = np.zeros(0, dtype=np.float32)
        return dropped
