"""One direction of a test call's audio: float32 mono samples and when each piece arrived.

Every transport of the peer records what it sends and what it receives here, at the peer's
rate (48 kHz), so the measurements (`measure.py`) and the checks read one shape whatever the
wire carried. Each piece keeps its arrival time (monotonic) and the sample offset it starts
at; `times()` gives the arrival times relative to the call's t0, the timeline every
measurement of a call is on.

A load-generating caller may keep counts instead of audio (`keep_audio=False`): the per-frame
loudness is kept, the samples are not.

What the after-call analysis derives from the kept audio (the pieces joined, laid on the
timeline, decimated) is computed once and kept with the recording (`derived`) until another
piece is added, so the measurements and the speech detection share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import av
import numpy as np

PEER_RATE = 48000
GAP_SECONDS = 0.06
LOUD_RMS_S16 = 300.0  # the test signal is about 8000 RMS; silence and codec noise far below
LOUD_RMS = LOUD_RMS_S16 / 32768.0

T = TypeVar("T")


@dataclass
class Recording:
    chunks: list[np.ndarray] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic, one per piece added
    first_at: float | None = None  # monotonic time of the first piece
    keep_audio: bool = True  # False: count samples only (cheap, for load generation)
    counted_samples: int = 0
    loud: list[bool] = field(default_factory=list)  # per frame, in count-only mode
    rate: int = PEER_RATE
    t0: float | None = None  # the call's t0 (monotonic); times() are relative to it
    offsets: list[int] = field(default_factory=list)  # sample offset of each piece
    kept_samples: int = 0
    resampler: av.AudioResampler = field(
        default_factory=lambda: av.AudioResampler(format="flt", layout="mono", rate=PEER_RATE)
    )
    _derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def _note(self, now: float) -> None:
        if self.first_at is None:
            self.first_at = now
        self.arrivals.append(now)
        self.offsets.append(self.sample_count)

    def add(self, frame: av.AudioFrame, arrived: float | None = None) -> None:
        """A decoded frame of any format and rate (resampled to float32 mono at `rate`)."""
        now = time.monotonic() if arrived is None else arrived
        self._note(now)
        if not self.keep_audio:
            self.counted_samples += frame.samples * self.rate // frame.sample_rate
            pcm = frame.to_ndarray().astype(np.float32)
            self.loud.append(float(np.sqrt(np.mean(pcm * pcm))) > LOUD_RMS_S16)
            return
        if frame.sample_rate == self.rate and frame.layout.nb_channels == 1:
            # Already mono at the rate: only the sample format to convert, as libswresample
            # would (s16 / 32768), without its per-frame call; the samples read straight
            # from the frame's buffer (to_ndarray costs several times the conversion).
            if frame.format.name == "s16":
                s16 = np.frombuffer(memoryview(frame.planes[0]), dtype=np.int16,
                                    count=frame.samples)
                self._keep(s16.astype(np.float32) * np.float32(1 / 32768))
                return
            if frame.format.name == "flt":
                flt = np.frombuffer(memoryview(frame.planes[0]), dtype=np.float32,
                                    count=frame.samples)
                self._keep(flt.copy())
                return
        frame.pts = None
        for out in self.resampler.resample(frame):
            self._keep(out.to_ndarray().reshape(-1).copy())

    def add_samples(self, samples: np.ndarray, arrived: float | None = None) -> None:
        """Float32 mono samples already at `rate`."""
        now = time.monotonic() if arrived is None else arrived
        self._note(now)
        if not self.keep_audio:
            self.counted_samples += len(samples)
            rms = float(np.sqrt(np.mean(samples * samples))) if len(samples) else 0.0
            self.loud.append(rms > LOUD_RMS)
            return
        self._keep(np.asarray(samples, dtype=np.float32).reshape(-1))

    def add_piece(self, samples: np.ndarray, arrived: float) -> None:
        """`add_samples` for what the peer itself made: float32 mono at `rate` already, one
        dimension (a payload's samples as `EncodedPlayback` keeps them), so nothing to check
        or convert; one call per packet sent."""
        if not self.keep_audio:
            self.add_samples(samples, arrived)
            return
        self._note(arrived)
        self._keep(samples)

    def _keep(self, chunk: np.ndarray) -> None:
        self.chunks.append(chunk)
        self.kept_samples += len(chunk)
        self._derived.clear()

    def derived(self, key: str, make: Callable[[], T]) -> T:
        """`make()`, computed once per `key` while no piece is added (what it returns is
        shared: arrays should be read-only)."""
        if key not in self._derived:
            self._derived[key] = make()
        value: T = self._derived[key]
        return value

    def remember(self, key: str, value: object) -> None:
        """Keep `value` under `key` until another piece is added."""
        self._derived[key] = value

    def recall(self, key: str) -> Any:
        """What `remember` kept under `key`, or None."""
        return self._derived.get(key)

    def joined(self) -> np.ndarray:
        """`samples()`, computed once and shared (read-only)."""
        def join() -> np.ndarray:
            out = self.samples()
            out.flags.writeable = False
            return out
        return self.derived("joined", join)

    @property
    def sample_count(self) -> int:
        return self.kept_samples + self.counted_samples

    @property
    def seconds(self) -> float:
        return self.sample_count / self.rate

    def samples(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self.chunks).astype(np.float32, copy=False)

    def times(self) -> list[float]:
        """Each piece's arrival in seconds since the call's t0 (since the first piece when
        no t0 was set)."""
        origin = self.t0 if self.t0 is not None else (self.first_at or 0.0)
        return [at - origin for at in self.arrivals]

    def start_time(self) -> float | None:
        """When sample 0 arrived, in seconds since t0."""
        times = self.times()
        return times[0] if times else None

    def loud_fraction(self) -> float | None:
        """Of the frames between the first and the last loud one, the share that was loud.

        A caller playing a continuous signal into an echo should get it back without silent
        holes; a server that falls behind and fills with silence shows up here even when its
        packets keep arriving on time.
        """
        if True not in self.loud:
            return None
        first = self.loud.index(True)
        last = len(self.loud) - 1 - self.loud[::-1].index(True)
        span = self.loud[first : last + 1]
        return sum(span) / len(span)

    def gaps(self, skip_seconds: float = 1.0) -> list[float]:
        """Pauses between arrivals longer than GAP_SECONDS, after the first `skip_seconds`."""
        if not self.arrivals:
            return []
        start = self.arrivals[0] + skip_seconds
        times = [t for t in self.arrivals if t >= start]
        return [b - a for a, b in zip(times, times[1:], strict=False) if b - a > GAP_SECONDS]
