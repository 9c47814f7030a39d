"""Agent audio (float32 at the plugin's rate) → exact 20 ms int16 chunks at a codec's rate.

The small ratios of a phone codec to a model (24 kHz → 8 or 16 kHz) go through a polyphase
filter of our own (polyphase.py: a 20 ms chunk in a few microseconds, each chunk out whole);
any other ratio through libswresample.
"""

from __future__ import annotations

import av
import numpy as np

from agent.audio.pcm import PTIME, float_to_s16
from agent.audio.polyphase import PolyphaseResampler, supported
from agent.audio.sample_fifo import SampleFifo


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

    def convert(self, samples: np.ndarray | None) -> np.ndarray:
        """`samples`: float32 mono, `source_samples` long, or None for silence."""
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
