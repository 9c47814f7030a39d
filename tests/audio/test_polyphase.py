"""The polyphase resampler: flat passband, aliasing rejected, exact output counts, any chunk
sizes giving the same stream, and close to libswresample on speech-band audio."""

from __future__ import annotations

import av
import numpy as np
import pytest

from agent.audio.polyphase import PolyphaseResampler, supported

PAIRS = [(8000, 24000), (24000, 8000), (16000, 24000), (24000, 16000), (48000, 24000)]


def tone(frequency: float, rate: int, seconds: float = 0.5, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def resample(source: int, target: int, samples: np.ndarray, chunk: int) -> np.ndarray:
    resampler = PolyphaseResampler(source, target, chunk)
    return np.concatenate([resampler.convert(samples[i:i + chunk])
                           for i in range(0, len(samples), chunk)])


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_each_chunk_gives_exactly_its_share_of_output(source: int, target: int) -> None:
    chunk = source // 50
    resampler = PolyphaseResampler(source, target, chunk)
    for _ in range(3):
        assert len(resampler.convert(np.zeros(chunk, dtype=np.float32))) == target // 50


@pytest.mark.parametrize(("source", "target"), PAIRS)
@pytest.mark.parametrize("frequency", [300.0, 1000.0, 3000.0])
def test_speech_band_tones_pass_at_unit_gain(source: int, target: int, frequency: float) -> None:
    out = resample(source, target, tone(frequency, source), source // 50)
    steady = out[len(out) // 4:]
    assert rms(steady) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)
    # and at the same frequency
    spectrum = np.abs(np.fft.rfft(steady * np.hanning(len(steady))))
    peak_hz = np.argmax(spectrum) * target / len(steady)
    assert peak_hz == pytest.approx(frequency, abs=target / len(steady) + 1)


@pytest.mark.parametrize(("source", "target", "frequency"),
                         [(24000, 8000, 4600.0), (24000, 8000, 7000.0), (24000, 16000, 9000.0),
                          (48000, 24000, 13000.0)])
def test_tones_above_the_target_nyquist_do_not_fold_back(source: int, target: int,
                                                           frequency: float) -> None:
    out = resample(source, target, tone(frequency, source), source // 50)
    assert 20 * np.log10(rms(out[len(out) // 4:]) / rms(tone(frequency, source))) < -60


def test_odd_chunk_sizes_give_the_same_stream_as_whole_chunks() -> None:
    rng = np.random.default_rng(1)
    signal = (rng.standard_normal(8000) * 0.1).astype(np.float32)
    whole = resample(8000, 24000, signal, 160)
    resampler = PolyphaseResampler(8000, 24000, 160)
    parts, start = [], 0
    for size in [80, 37, 160, 3, 240, 123] * 100:
        parts.append(resampler.convert(signal[start:start + size]))
        start += size
        if start >= len(signal):
            break
    pieces = np.concatenate(parts)
    # everything but the last partial row has come out, equal to the whole-chunk stream
    assert len(whole) - len(pieces) < resampler.row * 3
    np.testing.assert_allclose(pieces, whole[: len(pieces)], atol=1e-6)


def test_close_to_libswresample_on_speech_band_audio() -> None:
    """Band-limited noise (under 3 kHz) resampled 24 → 8 kHz both ways: after lining up the
    two filters' delays, they agree to better than -30 dB (measured: -89 dB)."""
    rng = np.random.default_rng(2)
    spectrum = np.fft.rfft(rng.standard_normal(24000))
    spectrum[np.fft.rfftfreq(24000, 1 / 24000) > 3000] = 0
    signal = (np.fft.irfft(spectrum) * 0.05).astype(np.float32)
    ours = resample(24000, 8000, signal, 480)
    libav = av.AudioResampler(format="flt", layout="mono", rate=8000)
    frame = av.AudioFrame.from_ndarray(signal.reshape(1, -1), format="flt", layout="mono")
    frame.sample_rate = 24000
    theirs = np.concatenate([out.to_ndarray().reshape(-1) for out in libav.resample(frame)]
                            + [out.to_ndarray().reshape(-1) for out in libav.resample(None)])
    # Line up by the cross-correlation peak (whole samples), then compare the middle.
    middle = slice(400, 7000)
    shifts = range(-40, 41)
    best = max(shifts, key=lambda s: float(np.dot(np.roll(ours, -s)[middle], theirs[middle])))
    residual = np.roll(ours, -best)[middle] - theirs[middle]
    assert 20 * np.log10(rms(residual) / rms(theirs[middle])) < -30


def test_the_delay_is_whole_output_samples() -> None:
    """A click comes out `delay_samples` later, at its peak there."""
    for source, target in PAIRS:
        click = np.zeros(source // 5, dtype=np.float32)
        click[source // 50] = 1.0  # at 20 ms
        out = resample(source, target, click, source // 50)
        assert int(np.argmax(out)) == target // 50 + PolyphaseResampler(
            source, target, source // 50).delay_samples


def test_supported_pairs() -> None:
    assert supported(8000, 24000) and supported(24000, 16000) and supported(48000, 24000)
    assert not supported(24000, 24000)
    assert not supported(44100, 24000)  # 80/147: libswresample's


def test_resamplers_of_one_rate_pair_share_their_filter() -> None:
    """Building the filter matrices takes about a millisecond of Python: 200 RTP legs whose
    callers start speaking together once paid it 200 times on the event loop (their first
    inbound chunk), the echo came back 0.25 s late and the catch-up later dropped 120 ms of
    it. Every resampler of a pair shares the one built at the first."""
    first = PolyphaseResampler(8000, 24000, 160)
    second = PolyphaseResampler(8000, 24000, 160)
    assert second._matrices is first._matrices
    assert not first._matrices.flags.writeable
    assert second._buffer is not first._buffer  # the stream state stays per resampler
