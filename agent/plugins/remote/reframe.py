"""Remote audio arrives in chunks of any size; the ticker needs exact frames."""

from __future__ import annotations

from collections import deque

import numpy as np


class Reframer:
    """Float32 samples in, exact `frame_size` frames out, oldest dropped past `max_frames`.

    Each frame remembers when its last sample arrived, so the caller can measure how long it
    waited here.
    """

    def __init__(self, frame_size: int, max_frames: int) -> None:
        self.frame_size = frame_size
        self.max_frames = max_frames
        self._frames: deque[tuple[np.ndarray, float]] = deque()
        self._partial = np.zeros(0, dtype=np.float32)
        self.dropped_frames = 0

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
        return self._frames.popleft() if self._frames else None

    def clear(self) -> int:
        dropped = len(self._frames) * self.frame_size + len(self._partial)
        self._frames.clear()
        self._partial = np.zeros(0, dtype=np.float32)
        return dropped
