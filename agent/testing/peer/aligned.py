"""A call's two recordings laid on its t0 timeline, sample for sample.

Each recorded piece carries its arrival time; played back to back, the pieces of a paced
stream drift from those times only by scheduling jitter, while a real pause (a transport that
sends nothing in silence, a stall) shows as a jump. So a piece goes right after the previous
one unless it arrived more than `JUMP_SECONDS` later than that, and then at its arrival. The
two channels then share one time axis: sample i of either is at i / rate seconds after t0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.testing.peer.recording import Recording

JUMP_SECONDS = 0.06


def sample_starts(recording: Recording) -> list[int]:
    """Where each kept piece starts on the t0 timeline, in samples."""
    rate = recording.rate
    starts: list[int] = []
    end = 0
    for index, (at, chunk) in enumerate(zip(recording.times(), recording.chunks,
                                            strict=False)):
        arrival = max(0, int(round(at * rate)))
        start = arrival if index == 0 or arrival - end > JUMP_SECONDS * rate else end
        starts.append(start)
        end = start + len(chunk)
    return starts


def on_timeline(recording: Recording, length: int | None = None) -> np.ndarray:
    """The recording as float32 samples from t0 (silence where nothing was sent/received)."""
    starts = sample_starts(recording)
    total = max((s + len(c) for s, c in zip(starts, recording.chunks, strict=False)), default=0)
    out = np.zeros(max(total, length or 0), dtype=np.float32)
    for start, chunk in zip(starts, recording.chunks, strict=False):
        out[start : start + len(chunk)] = chunk
    return out if length is None else out[:length]


@dataclass
class CallAudio:
    """Both channels of a call from t0: caller (what was sent) and agent (what came back)."""

    rate: int
    caller: np.ndarray
    agent: np.ndarray

    @classmethod
    def of(cls, sent: Recording, received: Recording) -> CallAudio:
        caller = on_timeline(sent)
        agent = on_timeline(received)
        length = max(len(caller), len(agent))
        return cls(sent.rate, _pad(caller, length), _pad(agent, length))

    @property
    def seconds(self) -> float:
        return len(self.caller) / self.rate

    def stereo(self) -> np.ndarray:
        """(n, 2): caller left, agent right."""
        return np.stack([self.caller, self.agent], axis=1)


def _pad(samples: np.ndarray, length: int) -> np.ndarray:
    if len(samples) >= length:
        return samples
    return np.concatenate([samples, np.zeros(length - len(samples), dtype=np.float32)])
