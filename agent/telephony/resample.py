"""Agent audio (float32 at the plugin's rate) → exact 20 ms int16 chunks at a codec's rate.

The small ratios of a phone codec to a model (24 kHz → 8 or 16 kHz) go through a polyphase
filter of our own (polyphase.py: a 20 ms chunk in a few microseconds, each chunk out whole);
any other ratio through libswresample. A leg converts one whole 20 ms chunk every 20 ms, so
that case (`ChunkFilter`) keeps its buffers and runs the filter's products into them: the
same arithmetic in the same order as polyphase.py, bit for bit, in about half the numpy
calls (each costs a microsecond or more whatever its size, and a phone leg pays them 50
times a second).
"""

from __future__ import annotations

import av
import numpy as np

from agent.audio.pcm import PTIME, float_to_s16
from agent.audio.polyphase import PolyphaseResampler, _layout, supported
from agent.audio.sample_fifo import SampleFifo

_LOW, _HIGH, _SCALE = np.float32(-1.0), np.float32(1.0), np.float32(32767.0)  # float_to_s16's


class ChunkFilter:
    """polyphase.py's filter for exactly one chunk of `chunk_samples` per call, straight to
    int16 (as `float_to_s16`), with its buffers made once: the output equals
    `float_to_s16(PolyphaseResampler(...).convert(chunk))` sample for sample."""

    def __init__(self, source_rate: int, target_rate: int, chunk_samples: int) -> None:
        layout = _layout(source_rate, target_rate, chunk_samples)
        if chunk_samples % layout.row:
            raise ValueError("the chunk is not a whole number of the filter's rows")
        rows, history = chunk_samples // layout.row, layout.history_rows
        self.chunk_samples = chunk_samples
        self._matrices = list(layout.matrices)
        buffer = np.zeros((history + rows, layout.row), dtype=np.float32)
        self._history = (buffer[:history], buffer[rows:])  # (its place, what it becomes)
        self._input = buffer[history:]
        # The rows each product reads: the chunk's own, then 1, 2, ... rows further back.
        self._reads = [buffer[history - back:history - back + rows] for back in range(history + 1)]
        self._out = np.empty((rows, layout.matrices.shape[2]), dtype=np.float32)
        self._part = np.empty_like(self._out)
        self._flat = self._out.reshape(-1)

    def convert(self, samples: np.ndarray | None) -> np.ndarray:
        """`samples`: `chunk_samples` floats scaled to ±1, or None for silence → int16."""
        place, becomes = self._history
        place[...] = becomes
        if samples is None:
            self._input.fill(0.0)
        else:
            self._input[...] = samples.reshape(self._input.shape)
        out, part = self._out, self._part
        np.matmul(self._reads[0], self._matrices[0], out=out)
        for back in range(1, len(self._reads)):
            np.matmul(self._reads[back], self._matrices[back], out=part)
            out += part
        flat = self._flat
        # np.clip's own checks cost more than the clipping (several µs); these two are it.
        np.maximum(flat, _LOW, out=flat)
        np.minimum(flat, _HIGH, out=flat)
        flat *= _SCALE
        return flat.astype(np.int16)


class ChunkResampler:
    """One 20 ms chunk in, one 20 ms chunk out, with the filter state carried across chunks.

    libswresample holds back its filter delay (a fraction of a millisecond), so the first
    chunk comes out a little short. Rather than wait a whole chunk for it, the output starts
    with that many zeros: the stream is then late by the filter delay only, and every later
    chunk finds a full 20 ms ready (so a mark answered after a chunk really follows its audio).
    """

    def __init__(self, source_rate: int, target_rate: int) -> None:
        self.source_rate = source_rate
        self.target_rate = target_rate
        self.source_samples = int(source_rate * PTIME)
        self.target_samples = int(target_rate * PTIME)
        self._fifo = SampleFifo(self.target_samples * 50)
        self._polyphase = (
            PolyphaseResampler(source_rate, target_rate, self.source_samples)
            if supported(source_rate, target_rate) else None
        )
        self._chunks: ChunkFilter | None = None
        if self._polyphase is not None:
            try:
                self._chunks = ChunkFilter(source_rate, target_rate, self.source_samples)
            except ValueError:  # a chunk of partial rows: the general filter takes it
                pass
        self._resampler = (
            av.AudioResampler(format="s16", layout="mono", rate=target_rate)
            if source_rate != target_rate and self._polyphase is None
            else None
        )
        self._started = False
        self.closed = False
        self.short_chunks = 0  # chunks padded with zeros (should stay 0 after the first)

    def close(self) -> None:
        """Free libav's resampler (and its threads) now, not when a GC cycle finds the leg."""
        self.closed = True
        self._resampler = None
        self._polyphase = None
        self._chunks = None

    def convert(self, samples: np.ndarray | None) -> np.ndarray:
        """`samples`: float32 mono, `source_samples` long, or None for silence."""
        if self._chunks is not None:
            return self._chunks.convert(samples)
        if self._polyphase is not None:
            source = np.zeros(self.source_samples, dtype=np.float32) if samples is None else samples
            return float_to_s16(self._polyphase.convert(source))
        pcm = (
            np.zeros(self.source_samples, dtype=np.int16) if samples is None
            else float_to_s16(samples)
        )
        if self._resampler is None or self.closed:
            return pcm[: self.target_samples] if self.closed else pcm
        produced = self._resample(pcm)
        if not self._started:
            self._started = True
            lead = self.target_samples - produced.size
            if lead > 0:
                self._fifo.push(np.zeros(lead, dtype=np.int16))
        self._fifo.push(produced)
        chunk = self._fifo.pop_available(self.target_samples)
        if chunk is None or len(chunk) < self.target_samples:
            self.short_chunks += 1
            padded = np.zeros(self.target_samples, dtype=np.int16)
            if chunk is not None:
                padded[: len(chunk)] = chunk
            return padded
        return chunk

    def _resample(self, pcm: np.ndarray) -> np.ndarray:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.source_rate
        assert self._resampler is not None
        parts = [out.to_ndarray().reshape(-1) for out in self._resampler.resample(frame)]
        if not parts:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(parts).astype(np.int16, copy=False)
