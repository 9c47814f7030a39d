"""A bounded FIFO of audio samples with arbitrary-size chunks in and out.

Used twice on a call's path: caller audio waiting for the next tick, and agent audio waiting
for the pacer. Overflow drops the oldest samples and counts them.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class SampleFifo:
    def __init__(self, capacity_samples: int) -> None:
        self.capacity_samples = capacity_samples
        self._chunks: deque[np.ndarray] = deque()
        self._head_offset = 0  # samples already consumed from _chunks[0]
        self.buffered_samples = 0
        self.dropped_samples = 0
        self.underrun_chunks = 0

    def push(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        self._chunks.append(samples)
        self.buffered_samples += len(samples)
        excess = self.buffered_samples - self.capacity_samples
        if excess > 0:
            self.discard(excess)
            self.dropped_samples += excess

    def clear(self) -> int:
        """Drop everything queued; returns how many samples were dropped."""
        dropped = self.buffered_samples
        self._chunks.clear()
        self._head_offset = 0
        self.buffered_samples = 0
        return dropped

    def pop(self, count: int) -> np.ndarray | None:
        """Exactly `count` samples, or None on underrun (partial audio stays queued)."""
        if self.buffered_samples < count:
            self.underrun_chunks += 1
            return None
        return self._take(count)

    def pop_available(self, count: int) -> np.ndarray | None:
        """Up to `count` samples (fewer on underrun), or None when empty."""
        if self.buffered_samples == 0:
            return None
        return self._take(min(count, self.buffered_samples))

    def peek(self, count: int) -> np.ndarray:
        """The oldest `count` samples (at most what is buffered), left queued."""
        parts = []
        needed = min(count, self.buffered_samples)
        offset = self._head_offset
        for chunk in self._chunks:
            if not needed:
                break
            take = min(needed, len(chunk) - offset)
            parts.append(chunk[offset : offset + take])
            needed -= take
            offset = 0
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def discard(self, count: int) -> None:
        """Drop the oldest `count` samples (at most what is buffered)."""
        count = min(count, self.buffered_samples)
        while count:
            take = min(count, len(self._chunks[0]) - self._head_offset)
            self._advance(take)
            count -= take

    def _take(self, count: int) -> np.ndarray:
        head = self._chunks[0]
        start = self._head_offset
        if len(head) - start >= count:
            out = head[start : start + count]
            self._advance(count)
            return out
        parts = []
        needed = count
        while needed:
            head = self._chunks[0]
            take = min(needed, len(head) - self._head_offset)
            parts.append(head[self._head_offset : self._head_offset + take])
            self._advance(take)
            needed -= take
        return np.concatenate(parts)

    def _advance(self, count: int) -> None:
        self._head_offset += count
        self.buffered_samples -= count
        if self._head_offset == len(self._chunks[0]):
            self._chunks.popleft()
            self._head_offset = 0
