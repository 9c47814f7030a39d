"""How close the agent's Opus encoding keeps speech to the original: shared by the encoder's
tests and `benchmarks/opus_complexity_bench.py`."""

from __future__ import annotations

import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from ..encoding import PTIME, InlineAudioEncoder

MAX_DELAY_S = 0.01  # Opus's look-ahead delays the decoded speech by 2.5 ms here


def read_wav_at(path: Path, rate: int) -> np.ndarray:
    """A mono 16-bit WAV as int16 samples at `rate`, cut to whole 20 ms chunks."""
    with wave.open(str(path)) as wav:
        source = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
        source_rate = wav.getframerate()
    frame = av.AudioFrame.from_ndarray(source.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = source_rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
    chunks = [out.to_ndarray().reshape(-1) for out in resampler.resample(frame)]
    chunks += [out.to_ndarray().reshape(-1) for out in resampler.resample(None)]
    samples = np.concatenate(chunks)
    chunk = int(rate * PTIME)
    return samples[: len(samples) // chunk * chunk]


def encode_opus(samples: np.ndarray, rate: int, complexity: int) -> list[bytes]:
    """One payload per 20 ms, through the agent's own outbound encoder."""
    encoder = InlineAudioEncoder("audio/opus", rate, opus_complexity=complexity)
    chunk = int(rate * PTIME)
    return [bytes(encoder.encode(samples[i:i + chunk])) for i in range(0, len(samples), chunk)]


def decode_opus_at_24k(payloads: list[bytes]) -> np.ndarray:
    decoder = av.CodecContext.create("libopus", "r")
    decoder.sample_rate, decoder.format, decoder.layout = 48000, "s16", "mono"
    out = []
    for index, payload in enumerate(payloads):
        packet = av.Packet(payload)
        packet.pts, packet.time_base = index * 960, Fraction(1, 48000)
        out += [frame.to_ndarray().reshape(-1) for frame in decoder.decode(packet)]
    # FFmpeg's libopus decoder answers 48 kHz whatever it is asked; speech has nothing above
    # 8 kHz, so every other sample is the 24 kHz signal.
    return np.concatenate(out).astype(np.float64)[::2]


def snr_db(original: np.ndarray, decoded: np.ndarray, rate: int) -> float:
    """Signal to coding-noise ratio at the delay that lines the two up best."""
    reference = original.astype(np.float64)
    max_delay = int(rate * MAX_DELAY_S)
    n = len(reference) - max_delay
    noise = min(float(np.sum((reference[:n] - decoded[delay:delay + n]) ** 2))
                for delay in range(max_delay))
    return 10.0 * float(np.log10(np.sum(reference[:n] ** 2) / max(noise, 1e-9)))
