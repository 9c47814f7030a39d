"""agent/testing/peer/recording.py: frames of any format land as float32 mono at the peer's
rate (those already mono at that rate without libswresample, to the same values), and what is
derived from the kept audio is shared until another piece arrives."""

from __future__ import annotations

import av
import numpy as np
import pytest

from agent.testing.peer.recording import PEER_RATE, Recording


def frame(samples: np.ndarray, fmt: str, layout: str, rate: int) -> av.AudioFrame:
    out = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format=fmt, layout=layout)
    out.sample_rate = rate
    return out


def through_libswresample(samples: np.ndarray, fmt: str, layout: str, rate: int) -> np.ndarray:
    resampler = av.AudioResampler(format="flt", layout="mono", rate=PEER_RATE)
    parts = [f.to_ndarray().reshape(-1)
             for f in resampler.resample(frame(samples, fmt, layout, rate))]
    return np.concatenate(parts)


@pytest.mark.parametrize("fmt", ["s16", "flt"])
def test_mono_at_the_rate_gives_what_libswresample_gives(fmt: str) -> None:
    rng = np.random.default_rng(1)
    samples = (rng.standard_normal(960) * 8000).astype(np.int16)
    if fmt == "flt":
        samples = (samples / 32768).astype(np.float32)
    recording = Recording()
    recording.add(frame(samples, fmt, "mono", PEER_RATE), 1.0)
    recording.add(frame(samples, fmt, "mono", PEER_RATE), 1.02)
    expected = through_libswresample(samples, fmt, "mono", PEER_RATE)
    assert recording.samples().dtype == np.float32
    assert np.array_equal(recording.samples(), np.concatenate([expected, expected]))
    assert recording.offsets == [0, 960]


def test_other_rates_and_layouts_are_resampled() -> None:
    tone = (np.sin(2 * np.pi * 440 * np.arange(1600) / 16000) * 8000).astype(np.int16)
    recording = Recording()
    recording.add(frame(tone, "s16", "mono", 16000), 1.0)
    assert len(recording.samples()) > 0 and recording.samples().dtype == np.float32
    stereo = np.repeat(tone[:480], 2).astype(np.int16)
    both = Recording()
    both.add(frame(stereo, "s16", "stereo", PEER_RATE), 1.0)
    assert len(both.samples()) == 480


def test_what_is_derived_is_kept_until_a_piece_is_added() -> None:
    recording = Recording()
    recording.add_samples(np.ones(960, np.float32), 1.0)
    joined = recording.joined()
    assert recording.joined() is joined and not joined.flags.writeable
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return len(calls)

    assert recording.derived("x", count) == 1
    assert recording.derived("x", count) == 1
    recording.remember("kept", "value")
    assert recording.recall("kept") == "value"
    recording.add_samples(np.zeros(960, np.float32), 1.02)
    assert recording.recall("kept") is None
    assert len(recording.joined()) == 1920
    assert recording.derived("x", count) == 2
