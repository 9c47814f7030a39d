from __future__ import annotations

import av
import numpy as np
import pytest

from agent.audio.framing import FrameAssembler

LAYOUTS = {1: "mono", 2: "stereo"}


def sine(rate: int, seconds: float, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def s16_frame(samples: np.ndarray, rate: int, channels: int) -> av.AudioFrame:
    interleaved = np.repeat(samples, channels) if channels > 1 else samples
    data = (interleaved * 32767).astype(np.int16).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(data, format="s16", layout=LAYOUTS[channels])
    frame.sample_rate = rate
    return frame


@pytest.mark.parametrize("rate", [8000, 16000, 44100, 48000])
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("chunk_ms", [7, 20, 33, 80, 250])
def test_frames_are_exact_for_any_rate_layout_and_chunking(
    rate: int, channels: int, chunk_ms: int
) -> None:
    assembler = FrameAssembler(sample_rate=24000, frame_size=1920)
    signal = sine(rate, 2.0)
    chunk = max(1, rate * chunk_ms // 1000)
    frames = []
    for start in range(0, len(signal), chunk):
        frames += assembler.push(s16_frame(signal[start : start + chunk], rate, channels))
    assert all(f.shape == (1920,) and f.dtype == np.float32 for f in frames)
    # Two seconds at 24 kHz is 25 frames; the resampler's filter may hold back a few ms.
    assert len(frames) in (24, 25)
    out = np.concatenate(frames)
    # The tone survives: its frequency is still 440 Hz at the plugin rate.
    spectrum = np.abs(np.fft.rfft(out[4800:]))
    peak_hz = np.argmax(spectrum) * 24000 / len(out[4800:])
    assert abs(peak_hz - 440) < 5
    assert 0.3 < np.max(np.abs(out[4800:])) < 0.6


def test_stereo_plugin_frames_keep_channels() -> None:
    assembler = FrameAssembler(sample_rate=24000, frame_size=1920, channels=2)
    frames = assembler.push(s16_frame(sine(48000, 0.5), 48000, 2))
    assert frames and all(f.shape == (1920, 2) for f in frames)


def test_pcm16_input_and_rate_switch_keep_exact_frames() -> None:
    assembler = FrameAssembler(sample_rate=24000, frame_size=1920)
    ulaw_like = (sine(8000, 1.0) * 32767).astype(np.int16)
    frames = []
    for start in range(0, len(ulaw_like), 160):
        frames += assembler.push_pcm16(ulaw_like[start : start + 160], 8000)
    # The source changes rate mid-stream (a codec switch): framing stays exact.
    frames += assembler.push(s16_frame(sine(48000, 1.0), 48000, 2))
    assert all(f.shape == (1920,) for f in frames)
    assert 22 <= len(frames) <= 25
