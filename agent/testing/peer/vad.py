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
  refined to the sample (`refine`): within `REFINE_SECONDS` of the voted edge, the edge moves
  to where the short-term energy (a `ENVELOPE_SECONDS` moving mean of the squared samples)
  crosses `EDGE_DB` below the segment's own mean energy. An edge with no such crossing near
  it (speech over a noise floor that never drops that low) keeps the detector's position.

The audio reaches the detector's 16 kHz through `downsample.py` (an FIR evaluated at the kept
samples), where an FFT over a whole call of arbitrary length cost ~20x as much.

`SpeechTracker` is the online form used while a script runs (one forward pass as audio
arrives); the checks are measured afterwards on `speech_segments` of the whole recording.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import webrtcvad

from agent.testing.peer.downsample import downsample

VAD_RATE = 16000
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


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the samples given
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def to_vad_rate(samples: np.ndarray, rate: int) -> np.ndarray:
    """Float mono at `rate` (a multiple of 16 kHz) → int16 at the detector's 16 kHz."""
    if rate % VAD_RATE:
        raise ValueError(f"sample rate {rate} is not a multiple of {VAD_RATE}")
    low = downsample(samples, rate // VAD_RATE)
    return np.clip(np.asarray(low) * 32768.0, -32768, 32767).astype(np.int16)


def _pass_mask(pcm: np.ndarray, shift: int) -> np.ndarray:
    """One forward pass on a grid starting at `shift` samples: speech per millisecond."""
    per_ms = VAD_RATE // 1000
    mask = np.zeros(len(pcm) // per_ms, dtype=bool)
    count = (len(pcm) - shift) // FRAME
    if count <= 0:
        return mask
    frames = pcm[shift : shift + count * FRAME].reshape(count, FRAME)
    audible = np.abs(frames.astype(np.int32)).max(axis=1) >= SILENT_PEAK * 32768
    raw = frames.tobytes()
    size = FRAME * 2
    vad = webrtcvad.Vad(MODE)
    voiced = np.zeros(count, dtype=bool)
    for index in np.flatnonzero(audible):
        start = int(index) * size
        voiced[index] = vad.is_speech(raw[start : start + size], VAD_RATE)
    # Each frame's decision covers its FRAME_MS milliseconds.
    per_frame = FRAME // per_ms
    spread = np.repeat(voiced, per_frame)
    offset = shift // per_ms
    mask[offset : offset + len(spread)] = spread[: len(mask) - offset]
    return mask


def _voted_mask(pcm: np.ndarray) -> np.ndarray:
    step = FRAME // PHASES
    votes = sum(_pass_mask(pcm, phase * step).astype(np.int32) for phase in range(PHASES))
    return np.asarray(votes) * 2 > PHASES


def speech_mask(samples: np.ndarray, rate: int) -> np.ndarray:
    """Speech (True) per millisecond of `samples`."""
    if len(samples) * VAD_RATE < FRAME * rate:  # shorter than one frame: no speech
        return np.zeros(len(samples) * 1000 // rate, dtype=bool)
    return _mask_of(to_vad_rate(samples, rate))


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
    forward = _voted_mask(pcm)
    backward = _voted_mask(np.ascontiguousarray(pcm[::-1]))[::-1]
    return np.asarray(forward & backward)


def refine(pcm: np.ndarray, segment: Segment) -> Segment:
    """`segment` (seconds into `pcm`, 16 kHz int16) with each edge moved to the sample where
    the short-term energy crosses EDGE_DB below the segment's mean energy, searched within
    REFINE_SECONDS of the edge; an edge without such a crossing there stays."""
    a, b = int(segment.start * VAD_RATE), int(segment.end * VAD_RATE)
    reach = int(REFINE_SECONDS * VAD_RATE)
    lo, hi = max(0, a - reach), min(len(pcm), b + reach)
    audio = pcm[lo:hi].astype(np.float64)
    if b - a < 2 * reach or len(audio) == 0:
        return segment
    width = max(1, int(ENVELOPE_SECONDS * VAD_RATE))
    energy = np.convolve(audio * audio, np.ones(width) / width, mode="same")
    level = float(np.mean(energy[a - lo : b - lo]))
    if level <= 0:
        return segment
    loud = energy >= level * 10 ** (-EDGE_DB / 10)
    start, end = a - lo, b - lo
    # The start: the beginning of the loud run that holds the point `reach` inside the edge.
    inside = start + reach
    if loud[inside]:
        quiet = np.flatnonzero(~loud[: inside + 1])
        first = int(quiet[-1]) + 1 if len(quiet) else 0
        if first > 0 and abs(first - start) <= reach:
            start = first
    inside = end - reach
    if loud[inside]:
        quiet = np.flatnonzero(~loud[inside:])
        last = inside + int(quiet[0]) if len(quiet) else len(loud)
        if last < len(loud) and abs(last - end) <= reach:
            end = last
    return Segment((start + lo) / VAD_RATE, (end + lo) / VAD_RATE)


def speech_segments(samples: np.ndarray, rate: int, offset: float = 0.0) -> list[Segment]:
    """Speech segments of `samples` (edges refined to the sample), in seconds from their
    start plus `offset`."""
    if len(samples) * VAD_RATE < FRAME * rate:
        return []
    pcm = to_vad_rate(samples, rate)
    segments = [refine(pcm, s) for s in mask_segments(_mask_of(pcm))]
    return [Segment(round(s.start + offset, 4), round(s.end + offset, 4)) for s in segments]


class SpeechTracker:
    """Online speech detection on a growing recording: when did speech (re)start?

    Fed the samples received so far; a run of `ONSET_FRAMES` speech frames is an onset, a
    run of non-speech frames as long as MIN_GAP ends it. Times are seconds from sample 0.
    """

    ONSET_FRAMES = 3

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.vad = webrtcvad.Vad(MODE)
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
