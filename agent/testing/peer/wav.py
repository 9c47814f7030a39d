"""WAV files in and out of the peer: any WAV read as float32 mono at the peer's rate (PyAV
reads and resamples it), and 16-bit mono written with the standard library."""

from __future__ import annotations

import wave

import av
import numpy as np

from agent.audio.pcm import float_to_s16
from agent.testing.peer.recording import PEER_RATE


def load_wav(path: str, rate: int = PEER_RATE) -> np.ndarray:
    """Any WAV → float32 mono at `rate` (PyAV reads and resamples it)."""
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    parts = []
    with av.open(path) as container:
        for frame in container.decode(audio=0):
            frame.pts = None
            parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def save_wav(path: str, samples: np.ndarray, sample_rate: int = PEER_RATE) -> None:
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(float_to_s16(samples).tobytes())

