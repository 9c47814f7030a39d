"""Speech segments of one channel of a call, from WebRTC's voice-activity detector.

The detector is `webrtcvad` (the `webrtcvad-wheels` distribution: the GMM detector of
Google's WebRTC, maintained, prebuilt wheels, about 1 µs per 10 ms frame). It was chosen over
Silero VAD because the peer must stay far cheaper per call than the agent it load-tests, and
Silero runs a neural network (torch or onnxruntime) per 32 ms chunk, while latency edges need
no more than a clean speech/non-speech decision.

Its decisions come on a 10 ms grid, and it keeps saying "speech" for a few frames after
speech ends (its hangover). Edges a few milliseconds wide need both undone:

- it runs forwards and on the time-reversed audio: a forward pass finds where speech starts
  (its hangover only delays the ends), a reversed pass where it ends, and speech is where
  both agree;
- the detector can run `PHASES` times, each on a grid shifted by 10 ms / PHASES, a
  millisecond counting as speech when most passes say so (edges on a finer grid). One pass
  is enough since the edges are refined to the sample (below), and each pass costs as much
  as the first (with 10 passes the detector was most of the peer's after-call CPU);
- a 10 ms frame with a few milliseconds of speech in it already counts as speech, so each
  detected edge sits up to a frame outside the speech. Each segment's edges are then
  refined to the sample of the full-rate audio (`refine`): within `REFINE_SECONDS` of the
  voted edge, the edge moves to where the short-term energy (a `ENVELOPE_SECONDS` moving
  mean of the squared samples) crosses `EDGE_DB` below the segment's own mean energy. An
  edge with no such crossing near it (speech over a noise floor that never drops that low)
  keeps the detector's position. Only the audio around the edges is looked at for this.

What it costs is kept low because the peer pays it after every call of a load test:

- the detector gets 8 kHz, the rate it works at inside (it halves 16 kHz input itself before
  anything else), from `downsample.py` (an FIR evaluated at the kept samples as two matrix
  products); a caller that already has the 8 kHz audio (the echo measurement decimates the
  same channels) hands it in (`segments_of`) instead of decimating again. Against the
  16 kHz input it had before, on 60 synthetic calls of speech-like bursts over noise floors
  (0 to -40 dBFS) the edges agree to 5 ms at the median and 24 ms at the 90th percentile
  (edges over a noise floor keep the detector's position, a frame or more apart): about as
  much as the 16 kHz edges themselves move when the audio is shifted by 1.2 ms (25 ms at
  the 90th percentile);
- frames of digital silence are never given to the detector, and the frames go to it
  without a copy or a per-frame numpy call.

Both passes stay full-length, 10 ms frames: running the reversed pass only around the ends
of the forward runs, or a first pass with 30 ms frames refined only around its edges (fresh
detectors there), halved the detector's cost but moved edges by 100 ms or more on such
audio where the full passes do not (a fresh detector calls the first frames of a noise
floor speech, and misses a weak last syllable that one adapted to the call hears).

`SpeechTracker` is the online form used while a script runs (one forward pass as audio
arrives); the checks are measured afterwards on `speech_segments` of the whole recording.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agent.testing.peer.downsample import downsample

VAD_RATE = 8000  # the detector's own rate (it halves 16 kHz input first)
FRAME_MS = 10
FRAME = VAD_RATE * FRAME_MS // 1000
PHASES = 1  # see the module docstring: the edges are refined to the sample instead
MODE = 3  # the detector's most aggressive setting: fewest non-speech frames called speech
MIN_GAP = 0.25  # pauses shorter than this inside speech do not end a segment (seconds)
MIN_SPEECH = 0.06  # shorter bursts are clicks, not speech (seconds)
SILENT_PEAK = 1e-4  # frames of digital silence (or near it) are never speech
REFINE_SECONDS = 0.025  # how far from the voted edge the refined one may lie (2.5 frames)
ENVELOPE_SECONDS = 0.001  # the short-term energy's window
EDGE_DB = 30.0  # an edge is where the energy is this far below the segment's mean energy


def detector() -> Any:
    """A fresh detector; webrtcvad comes with the peer extra, imported only when used."""
    import webrtcvad

    return webrtcvad.Vad(MODE)


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the samples given
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def vad_factor(rate: int) -> int:
    """The decimation factor from `rate` to VAD_RATE; ValueError unless a whole one."""
    if rate % VAD_RATE or rate < VAD_RATE:
        raise ValueError(f"sample rate {rate} is not a multiple of {VAD_RATE}")
    return rate // VAD_RATE


def to_pcm(low: np.ndarray) -> np.ndarray:
    """Float audio at VAD_RATE → the detector's int16."""
    return np.clip(np.asarray(low, dtype=np.float32) * 32768.0, -32768, 32767).astype(np.int16)


def to_vad_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """Float mono at `rate` (a multiple of 8 kHz) → int16 at the detector's 8 kHz."""
    return to_pcm(downsample(samples, vad_factor(rate)))


def _pass_mask(pcm: np.ndarray, shift: int) -> np.ndarray:
    """One forward pass on a grid starting at `shift` samples: speech per millisecond."""
    per_ms = VAD_RATE // 1000
    mask = np.zeros(len(pcm) // per_ms, dtype=bool)
    count = (len(pcm) - shift) // FRAME
    if count <= 0:
        return mask
    frames = pcm[shift : shift + count * FRAME].reshape(count, FRAME)
    audible = np.abs(frames.astype(np.int32)).max(axis=1) >= SILENT_PEAK * 32768
    raw = memoryview(frames.tobytes())
    size = FRAME * 2
    is_speech = detector().is_speech
    voiced = np.zeros(count, dtype=bool)
    heard = np.flatnonzero(audible)
    voiced[heard] = [is_speech(raw[start : start + size], VAD_RATE)
                     for start in (heard * size).tolist()]
    # Each frame's decision covers its FRAME_MS milliseconds.
    spread = np.repeat(voiced, FRAME // per_ms)
    offset = shift // per_ms
    mask[offset : offset + len(spread)] = spread[: len(mask) - offset]
    return mask


def _voted_mask(pcm: np.ndarray) -> np.ndarray:
    step = FRAME // PHASES
    votes = sum(_pass_mask(pcm, phase * step).astype(np.int32) for phase in range(PHASES))
    return np.asarray(votes) * 2 > PHASES


def mask_segments(mask: np.ndarray, min_gap: float = MIN_GAP,
                  min_speech: float = MIN_SPEECH, step: float = 0.001) -> list[Segment]:
    """Runs of True in a per-`step` mask, short pauses bridged and short bursts dropped."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    merged: list[list[int]] = []
    for start, end in runs:
        if merged and (start - merged[-1][1]) * step < min_gap:
            merged[-1][1] = end
        else:
            merged.append([start, end])
    return [Segment(round(a * step, 4), round(b * step, 4)) for a, b in merged
            if (b - a) * step >= min_speech]


def _mask_of(pcm: np.ndarray) -> np.ndarray:
    """Speech per millisecond: where the forward and the reversed pass agree."""
    forward = _voted_mask(pcm)
    backward = _voted_mask(np.ascontiguousarray(pcm[::-1]))[::-1]
    return np.asarray(forward & backward)


@dataclass(frozen=True)
class Placed:
    """Full-rate audio on a timeline of `length` samples: samples[k] lies at timeline sample
    `origin` + k, and the timeline is silent elsewhere (a channel's joined pieces where none
    jumps, without laying them out)."""

    samples: np.ndarray
    origin: int
    length: int

    def window(self, lo: int, hi: int) -> np.ndarray:
        """Timeline samples [lo, hi) as float32 (zeros outside the audio)."""
        out = np.zeros(max(0, hi - lo), dtype=np.float32)
        first, last = max(lo, self.origin), min(hi, self.origin + len(self.samples))
        if last > first:
            out[first - lo : last - lo] = self.samples[first - self.origin : last - self.origin]
        return out


def refine(samples: np.ndarray | Placed, rate: int, segment: Segment) -> Segment:
    """`segment` (seconds into `samples`, float mono at `rate`) with each edge moved to the
    sample where the short-term energy crosses EDGE_DB below the segment's mean energy,
    searched within REFINE_SECONDS of the edge; an edge without such a crossing there stays."""
    audio = samples if isinstance(samples, Placed) else Placed(samples, 0, len(samples))
    a = max(0, int(segment.start * rate))
    b = min(audio.length, int(segment.end * rate))
    reach = int(REFINE_SECONDS * rate)
    if b - a < 2 * reach:
        return segment
    # Single precision: OpenBLAS spreads a long double-precision dot over its threads.
    body = audio.window(a, b)
    level = float(np.dot(body, body)) / (b - a)
    if level <= 0:
        return segment
    threshold = level * 10 ** (-EDGE_DB / 10)
    width = max(1, int(ENVELOPE_SECONDS * rate))
    start, end = a, b
    # The start: the beginning of the loud run that holds the point `reach` inside the edge.
    lo = max(0, a - reach)
    loud = _loud(audio, lo, a + reach + 1, width, threshold)
    if loud[-1]:
        quiet = np.flatnonzero(~loud)
        if len(quiet):
            start = lo + int(quiet[-1]) + 1
    # The end: the end of the loud run that holds the point `reach` inside it.
    hi = min(audio.length, b + reach)
    loud = _loud(audio, b - reach, hi, width, threshold)
    if loud[0]:
        quiet = np.flatnonzero(~loud)
        if len(quiet):
            end = b - reach + int(quiet[0])
    return Segment(start / rate, end / rate)


def _loud(audio: Placed, lo: int, hi: int, width: int, threshold: float) -> np.ndarray:
    """Per sample of the timeline's [lo, hi): is the centred `width`-sample mean energy at
    least `threshold`?"""
    pad = width // 2 + 1
    left = max(0, lo - pad)
    around = audio.window(left, min(audio.length, hi + pad)).astype(np.float64)
    energy = np.convolve(around * around, np.ones(width) / width, mode="same")
    return np.asarray(energy[lo - left : lo - left + (hi - lo)] >= threshold)


def speech_segments(samples: np.ndarray, rate: int, offset: float = 0.0) -> list[Segment]:
    """Speech segments of `samples` (edges refined to the sample), in seconds from their
    start plus `offset`."""
    factor = vad_factor(rate)
    if len(samples) * VAD_RATE < FRAME * rate:
        return []
    return segments_of(downsample(samples, factor), samples, rate, 0, offset)


def segments_of(low: np.ndarray, samples: np.ndarray | Placed, rate: int, low_start: int = 0,
                offset: float = 0.0) -> list[Segment]:
    """`speech_segments` of `samples` (float mono at `rate`, or placed on a timeline) with
    the detector's audio given: `low` is `samples` band-limited to VAD_RATE, its sample k at
    sample `low_start` + k × rate / VAD_RATE of `samples` (`downsample.py`'s output of
    samples from `low_start` on, which may be negative: zeros before sample 0)."""
    if len(low) < FRAME:
        return []
    shift = low_start / rate
    voted = [Segment(s.start + shift, s.end + shift) for s in mask_segments(_mask_of(to_pcm(low)))]
    segments = [refine(samples, rate, s) for s in voted]
    return [Segment(round(s.start + offset, 4), round(s.end + offset, 4)) for s in segments]


class SpeechTracker:
    """Online speech detection on a growing recording: when did speech (re)start?

    Fed the samples received so far; a run of `ONSET_FRAMES` speech frames is an onset, a
    run of non-speech frames as long as MIN_GAP ends it. Times are seconds from sample 0.
    """

    ONSET_FRAMES = 3

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.vad = detector()
        self.pending = np.zeros(0, dtype=np.int16)
        self.frames = 0  # frames decided so far
        self.run = 0  # consecutive frames of the current state's opposite
        self.speaking = False
        self.onsets: list[float] = []
        self.offsets: list[float] = []
        self.consumed = 0  # input samples taken so far

    def feed(self, samples: np.ndarray) -> None:
        if len(samples) == 0:
            return
        self.consumed += len(samples)
        pcm = to_vad_rate(np.asarray(samples), self.rate)
        self.pending = np.concatenate([self.pending, pcm])
        quiet_frames = int(MIN_GAP * 1000 / FRAME_MS)
        while len(self.pending) >= FRAME:
            frame, self.pending = self.pending[:FRAME], self.pending[FRAME:]
            speech = (int(np.max(np.abs(frame))) >= SILENT_PEAK * 32768
                      and self.vad.is_speech(frame.tobytes(), VAD_RATE))
            self.frames += 1
            if speech != self.speaking:
                self.run += 1
            else:
                self.run = 0
            if not self.speaking and self.run >= self.ONSET_FRAMES:
                self.speaking, self.run = True, 0
                self.onsets.append((self.frames - self.ONSET_FRAMES) * FRAME_MS / 1000)
            elif self.speaking and self.run >= quiet_frames:
                self.speaking, self.run = False, 0
                self.offsets.append((self.frames - quiet_frames) * FRAME_MS / 1000)
