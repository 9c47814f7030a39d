"""How close the agent's Opus encoding keeps speech to the original: shared by the encoder's
tests and `benchmarks/opus_complexity_bench.py`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from aiortc.jitterbuffer import JitterFrame

from agent.audio.pcm import PTIME, float_to_s16
from agent.rtc_tuning import MonoOpusDecoder
from agent.testing.peer import load_wav
from agent.webrtc.encoding import InlineAudioEncoder

MAX_DELAY_S = 0.01  # Opus's look-ahead delays the decoded speech by 2.5 ms here


def read_wav_at(path: Path, rate: int) -> np.ndarray:
    """A WAV as mono int16 samples at `rate`, cut to whole 20 ms chunks."""
    samples = float_to_s16(load_wav(str(path), rate))
    chunk = int(rate * PTIME)
    return samples[: len(samples) // chunk * chunk]


def encode_opus(samples: np.ndarray, rate: int, complexity: int) -> list[bytes]:
    """One payload per 20 ms, through the agent's own outbound encoder."""
    encoder = InlineAudioEncoder("audio/opus", rate, opus_complexity=complexity)
    chunk = int(rate * PTIME)
    return [bytes(encoder.encode(samples[i:i + chunk])) for i in range(0, len(samples), chunk)]


def decode_opus_at_24k(payloads: list[bytes]) -> np.ndarray:
    """Through the agent's own inbound decoder, which answers 48 kHz (FFmpeg's libopus
    decoder always does); speech has nothing above 8 kHz, so every other sample is the
    24 kHz signal."""
    decoder = MonoOpusDecoder()
    samples_per_payload = int(decoder.RATE * PTIME)
    out = [frame.to_ndarray().reshape(-1)
           for index, payload in enumerate(payloads)
           for frame in decoder.decode(JitterFrame(data=payload,
                                                   timestamp=index * samples_per_payload))]
    return np.concatenate(out).astype(np.float64)[::2]


def snr_db(original: np.ndarray, decoded: np.ndarray, rate: int) -> float:
    """Signal to coding-noise ratio at the delay that lines the two up best."""
    reference = original.astype(np.float64)
    max_delay = int(rate * MAX_DELAY_S)
    n = len(reference) - max_delay
    noise = min(float(np.sum((reference[:n] - decoded[delay:delay + n]) ** 2))
                for delay in range(max_delay))
    return 10.0 * float(np.log10(np.sum(reference[:n] ** 2) / max(noise, 1e-9)))
