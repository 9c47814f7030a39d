"""A call's two recordings laid on its t0 timeline, sample for sample.

Each recorded piece carries its arrival time; played back to back, the pieces of a paced
stream drift from those times only by scheduling jitter, while a real pause (a transport that
sends nothing in silence, a stall) shows as a jump. So a piece goes right after the previous
one unless it arrived more than `JUMP_SECONDS` later than that, and then at its arrival. The
two channels then share one time axis: sample i of either is at i / rate seconds after t0.

The timeline of a recording is built once and kept with it (read-only). A recording whose
pieces all play back to back (no jump) is its joined samples from its first piece's start;
audio decimated from those joined samples (the echo measurement's) is then the timeline's
too, and is kept with the recording (`share_low_rate`) for the speech detection
(`shared_low_rate`), which would otherwise decimate the same channel again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.testing.peer.recording import Recording

JUMP_SECONDS = 0.06
WINDOW = 1024  # pieces laid out per vectorised step


@dataclass(frozen=True)
class LowRate:
    """A channel's timeline band-limited and decimated by `factor`: samples[k] lies at
    timeline sample start + k × factor (start may be negative: zeros before t0). The
    timeline is the recording's joined samples from `joined_at` on (silence before)."""

    samples: np.ndarray
    start: int
    factor: int
    joined_at: int


@dataclass(frozen=True)
class _Layout:
    starts: np.ndarray  # int64, each piece's first sample on the timeline
    total: int  # the end of the last piece
    jumps: bool  # some piece does not follow the previous one (or pieces and times differ)


def sample_starts(recording: Recording) -> list[int]:
    """Where each kept piece starts on the t0 timeline, in samples."""
    return [int(v) for v in _layout(recording).starts]


def timeline_length(recording: Recording) -> int:
    """Samples from t0 to the end of the last piece."""
    return _layout(recording).total


def _layout(recording: Recording) -> _Layout:
    layout: _Layout = recording.derived("layout", lambda: _lay_out(recording))
    return layout


def _lay_out(recording: Recording) -> _Layout:
    # Vectorised over runs of pieces played back to back (at most WINDOW pieces a step):
    # within a run each start is the previous end; a run ends where an arrival jumps.
    count = min(len(recording.arrivals), len(recording.chunks))
    if count == 0:
        return _Layout(np.zeros(0, dtype=np.int64), 0, len(recording.chunks) > 0)
    rate = recording.rate
    arrivals = np.maximum(0, np.rint(np.asarray(recording.times()[:count]) * rate))
    arrivals = arrivals.astype(np.int64)
    lengths = np.fromiter((len(c) for c in recording.chunks[:count]), np.int64, count)
    limit = JUMP_SECONDS * rate
    starts = np.empty(count, dtype=np.int64)
    index, base = 0, int(arrivals[0])
    while index < count:
        stop = min(count, index + WINDOW)
        chained = base + np.concatenate([[0], np.cumsum(lengths[index : stop - 1])])
        jumped = np.flatnonzero(arrivals[index + 1 : stop] - chained[1:] > limit)
        if len(jumped):
            stop = index + 1 + int(jumped[0])
            starts[index:stop] = chained[: stop - index]
            base = int(arrivals[stop])
        else:
            starts[index:stop] = chained
            if stop < count:
                end = int(chained[-1] + lengths[stop - 1])
                base = int(arrivals[stop]) if arrivals[stop] - end > limit else end
        index = stop
    ends = starts + lengths
    jumps = count != len(recording.chunks) or bool(np.any(starts[1:] != ends[:-1]))
    return _Layout(starts, int(ends.max()), jumps)


def on_timeline(recording: Recording, length: int | None = None) -> np.ndarray:
    """The recording as float32 samples from t0 (silence where nothing was sent/received),
    cut or padded to `length` when given; kept with the recording (read-only)."""
    key = "timeline" if length is None else f"timeline:{length}"
    laid: np.ndarray = recording.derived(key, lambda: _timeline(recording, length))
    return laid


def _timeline(recording: Recording, length: int | None) -> np.ndarray:
    layout = _layout(recording)
    out = np.zeros(max(layout.total, length or 0), dtype=np.float32)
    if len(layout.starts) and not layout.jumps:
        out[int(layout.starts[0]) : layout.total] = recording.joined()
    else:
        for start, chunk in zip(layout.starts.tolist(), recording.chunks, strict=False):
            out[start : start + len(chunk)] = chunk
    if length is not None:
        out = out[:length]
    out.flags.writeable = False
    return out


def has_jumps(recording: Recording) -> bool:
    """Whether some piece does not follow the previous one on the timeline (or the pieces
    and their arrival times do not pair up)."""
    return _layout(recording).jumps


def share_low_rate(recording: Recording, low: np.ndarray, joined_start: int,
                   factor: int) -> None:
    """Keep `low` (the recording's joined samples from index `joined_start`, decimated by
    `factor`) as its timeline's low-rate audio, where the two are the same (no jump)."""
    layout = _layout(recording)
    if not len(layout.starts) or layout.jumps:
        return
    first = int(layout.starts[0])
    recording.remember("low_rate", LowRate(low, first + joined_start, factor, first))


def shared_low_rate(recording: Recording) -> LowRate | None:
    """What `share_low_rate` kept, while the recording is unchanged."""
    low: LowRate | None = recording.recall("low_rate")
    return low


@dataclass
class CallAudio:
    """Both channels of a call from t0: caller (what was sent) and agent (what came back)."""

    rate: int
    caller: np.ndarray
    agent: np.ndarray

    @classmethod
    def of(cls, sent: Recording, received: Recording) -> CallAudio:
        """Both timelines at the longer one's length (read-only: kept with the recordings)."""
        length = max(timeline_length(sent), timeline_length(received))
        return cls(sent.rate, on_timeline(sent, length), on_timeline(received, length))

    @property
    def seconds(self) -> float:
        return len(self.caller) / self.rate

    def stereo(self) -> np.ndarray:
        """(n, 2): caller left, agent right."""
        return np.stack([self.caller, self.agent], axis=1)
