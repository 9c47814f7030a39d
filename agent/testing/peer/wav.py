"""WAV files in and out of the peer: any WAV read as float32 mono at the peer's rate (PyAV
reads and resamples it; `read_audio_file` turns what goes wrong into a CliError), and 16-bit
mono written with the standard library."""

from __future__ import annotations

import wave

import av
import numpy as np

from agent.audio.pcm import float_to_s16
from agent.cli_errors import CliError
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


def read_audio_file(path: str, label: str, code: str) -> np.ndarray:
    """`load_wav`, its failures as errors `{code}_not_found`, `{code}_unreadable` and
    `{code}_empty` whose messages start with `label`."""
    try:
        samples = load_wav(path)
    except FileNotFoundError:
        raise CliError(f"{code}_not_found", f"{label}: no such file") from None
    except (OSError, av.error.FFmpegError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "not a readable audio file"
        raise CliError(f"{code}_unreadable", f"{label}: {reason}") from None
    if len(samples) == 0:
        raise CliError(f"{code}_empty", f"{label}: no audio in the file")
    return samples


def save_wav(path: str, samples: np.ndarray, sample_rate: int = PEER_RATE) -> None:
    with wave.open(path, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(float_to_s16(samples).tobytes())

