"""Voice prompts from a recording (`.wav` in the voices folder), as NVIDIA's reference makes them.

The reference (`LMGen.load_voice_prompt`) reads the file, resamples it to the model's rate
(sphn), normalises its integrated loudness to -24 LUFS (pyloudnorm, ITU-R BS.1770), cuts it
into whole Mimi frames (the last one padded with zeros) and Mimi-encodes them one frame at a
time from a fresh streaming state. The codes then go through the prefill as forced agent frames
(prompt.py); that is also how the released `.pt` voice files were made.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyloudnorm
import sphn
import torch

from agent.plugins.base import PluginError
from agent.plugins.personaplex import streaming

if TYPE_CHECKING:
    from agent.plugins.personaplex.mimi import MimiModel

TARGET_LUFS = -24.0
MAX_VOICE_SECONDS = 60.0  # the released voice prompts are a few seconds long


class VoiceAudioError(PluginError, ValueError):
    """A voice recording that cannot be used; the message names the file and why."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_voice_audio", message)


class UploadedVoices:
    """Uploaded recordings by voice name, held while a call waits for their prompt.

    The prefill thread reads them from here; once the snapshot is made the cache keeps it by
    the same name (the content hash), so the bytes are dropped when the last waiting call
    is done with them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[bytes, int]] = {}

    @contextlib.contextmanager
    def holding(self, name: str, data: bytes) -> Iterator[None]:
        with self._lock:
            _, count = self._held.get(name, (data, 0))
            self._held[name] = (data, count + 1)
        try:
            yield
        finally:
            with self._lock:
                _, count = self._held[name]
                if count == 1:
                    del self._held[name]
                else:
                    self._held[name] = (data, count - 1)

    def get(self, name: str) -> bytes | None:
        with self._lock:
            held = self._held.get(name)
            return held[0] if held is not None else None


def read_voice_audio(source: Path | bytes, sample_rate: int,
                     max_seconds: float = MAX_VOICE_SECONDS, name: str | None = None) -> np.ndarray:
    """The recording's first channel at `sample_rate`, float32, normalised to -24 LUFS.

    `source` is a file, or the bytes of one (an upload); `name` is what errors call it.
    """
    label = name or (source.name if isinstance(source, Path) else "upload")
    try:
        if isinstance(source, Path):
            pcm, source_rate = sphn.read(str(source))
        else:
            # sphn reads files only; it probes the format from the content, not the name.
            with tempfile.NamedTemporaryFile(prefix="voice-upload-") as spool:
                spool.write(source)
                spool.flush()
                pcm, source_rate = sphn.read(spool.name)
    except Exception as exc:  # sphn raises plain exceptions for unreadable audio
        raise VoiceAudioError(f"voice {label} cannot be read as audio: {exc}") from None
    if pcm.size == 0:
        raise VoiceAudioError(f"voice {label} has no audio")
    if pcm.shape[-1] / source_rate > max_seconds:
        raise VoiceAudioError(f"voice {label} is {pcm.shape[-1] / source_rate:.1f} s long; "
                              f"voice recordings are limited to {max_seconds:g} s")
    pcm = sphn.resample(pcm, src_sample_rate=source_rate, dst_sample_rate=sample_rate)
    mono = np.asarray(pcm[0], dtype=np.float64)  # the reference keeps the first channel
    meter = pyloudnorm.Meter(sample_rate)
    loudness = meter.integrated_loudness(mono)
    if not np.isfinite(loudness):
        raise VoiceAudioError(f"voice {label} is silent (no loudness to normalise)")
    return np.asarray(pyloudnorm.normalize.loudness(mono, loudness, TARGET_LUFS),
                      dtype=np.float32)


@torch.no_grad()
def encode_voice(mimi: MimiModel, audio: np.ndarray, codebooks: int) -> torch.Tensor:
    """Mimi codes [frames, codebooks] of `audio`, one frame at a time from a fresh state.
    `mimi` must be a copy no other thread streams through (see prompt.detached_copy)."""
    frame_size = int(mimi.frame_size)
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
