"""Voice prompts from a recording (`.wav` in the voices folder), as NVIDIA's reference makes them.

The reference (`LMGen.load_voice_prompt`) reads the file, resamples it to the model's rate
(sphn), normalises its integrated loudness to -24 LUFS (pyloudnorm, ITU-R BS.1770), cuts it
into whole Mimi frames (the last one padded with zeros) and Mimi-encodes them one frame at a
time from a fresh streaming state. The codes then go through the prefill as forced agent frames
(prompt.py); that is also how the released `.pt` voice files were made.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyloudnorm
import sphn
import torch
from torch import nn

from . import streaming

TARGET_LUFS = -24.0
MAX_VOICE_SECONDS = 60.0  # the released voice prompts are a few seconds long


class VoiceAudioError(ValueError):
    """A voice recording that cannot be used; the message names the file and why."""


def read_voice_audio(path: Path, sample_rate: int,
                     max_seconds: float = MAX_VOICE_SECONDS) -> np.ndarray:
    """The recording's first channel at `sample_rate`, float32, normalised to -24 LUFS."""
    try:
        pcm, source_rate = sphn.read(str(path))
    except Exception as exc:  # sphn raises plain exceptions for unreadable audio
        raise VoiceAudioError(f"voice {path.name} cannot be read as audio: {exc}") from None
    if pcm.size == 0:
        raise VoiceAudioError(f"voice {path.name} has no audio")
    if pcm.shape[-1] / source_rate > max_seconds:
        raise VoiceAudioError(f"voice {path.name} is {pcm.shape[-1] / source_rate:.1f} s long; "
                              f"voice recordings are limited to {max_seconds:g} s")
    pcm = sphn.resample(pcm, src_sample_rate=source_rate, dst_sample_rate=sample_rate)
    mono = np.asarray(pcm[0], dtype=np.float64)  # the reference keeps the first channel
    meter = pyloudnorm.Meter(sample_rate)
    loudness = meter.integrated_loudness(mono)
    if not np.isfinite(loudness):
        raise VoiceAudioError(f"voice {path.name} is silent (no loudness to normalise)")
    return np.asarray(pyloudnorm.normalize.loudness(mono, loudness, TARGET_LUFS),
                      dtype=np.float32)


@torch.no_grad()
def encode_voice(mimi: nn.Module, audio: np.ndarray, codebooks: int) -> torch.Tensor:
    """Mimi codes [frames, codebooks] of `audio`, one frame at a time from a fresh state.
    `mimi` must be a copy no other thread streams through (see prompt.detached_copy)."""
    frame_size = int(mimi.frame_size)  # type: ignore[arg-type]
    frames = -(-len(audio) // frame_size)
    padded = np.zeros(frames * frame_size, dtype=np.float32)
    padded[: len(audio)] = audio
    device = next(mimi.parameters()).device
    streaming.start_streaming(mimi, 1)
    try:
        codes = [
            mimi.encode(torch.from_numpy(padded[i * frame_size:(i + 1) * frame_size])
                        .to(device)[None, None])[0, :codebooks, 0]
            for i in range(frames)
        ]
    finally:
        streaming.stop_streaming(mimi)
    return torch.stack(codes)
