"""Agent audio (float32 at the plugin's rate) → exact 20 ms int16 chunks at a codec's rate."""

from __future__ import annotations

import av
import numpy as np

from ..outbound import float_to_s16
from .codec import PTIME


class ChunkResampler:
    """One 20 ms chunk in, one 20 ms chunk out, with the filter state carried across chunks.

    libswresample holds back a few samples of filter delay, so the first chunk would come
    out short; priming with one chunk of silence makes every later chunk yield exactly one.
    """

    def __init__(self, source_rate: int, target_rate: int) -> None:
        self.source_rate = source_rate
        self.target_rate = target_rate
        self.source_samples = int(source_rate * PTIME)
        self.target_samples = int(target_rate * PTIME)
        self._silence = np.zeros(self.target_samples, dtype=np.int16)
        self._pending: list[np.ndarray] = []
        self._resampler = (
            av.AudioResampler(
                format="s16", layout="mono", rate=target_rate, frame_size=self.target_samples
            )
            if source_rate != target_rate
            else None
        )
        if self._resampler is not None:
            self._resample(np.zeros(self.source_samples, dtype=np.int16))
            self._pending.clear()

    def convert(self, samples: np.ndarray | None) -> np.ndarray:
        """`samples`: float32 mono, `source_samples` long, or None for silence."""
        pcm = (
            np.zeros(self.source_samples, dtype=np.int16) if samples is None
            else float_to_s16(samples)
        )
        if self._resampler is None:
            return pcm
        self._resample(pcm)
        return self._pending.pop(0) if self._pending else self._silence

    def _resample(self, pcm: np.ndarray) -> None:
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.source_rate
        for out in self._resampler.resample(frame):  # type: ignore[union-attr]
            self._pending.append(out.to_ndarray().reshape(-1).copy())
