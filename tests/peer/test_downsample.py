"""agent/testing/peer/downsample.py: the pass band kept in time (zero phase), the band above
the new Nyquist frequency removed, any length, the same output as the filter applied directly;
upsampling on the same grid."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.downsample import downsample, lowpass, upsample

RATE = 48000


def tone(hz: float, seconds: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    t = np.arange(int(RATE * seconds)) / RATE
    return t, np.sin(2 * np.pi * hz * t)


@pytest.mark.parametrize("factor,hz", [(6, 300), (6, 3000), (3, 1000), (3, 5500)])
def test_the_pass_band_keeps_its_level_and_its_timing(factor: int, hz: float) -> None:
    t, x = tone(hz)
    y = downsample(x, factor)
    assert len(y) == len(x) // factor
    inner = slice(200, -200)  # away from the zero padding at both ends
    expected = np.sin(2 * np.pi * hz * t[::factor])
    assert np.max(np.abs(y[inner] - expected[inner])) < 0.01


@pytest.mark.parametrize("factor,hz", [(6, 4400), (6, 9000), (3, 8800)])
def test_what_would_alias_is_removed(factor: int, hz: float) -> None:
    _, x = tone(hz)
    assert np.max(np.abs(downsample(x, factor)[200:-200])) < 1e-3


def test_any_length_and_no_change_at_factor_one() -> None:
    x = np.random.default_rng(2).standard_normal(48007)
    assert len(downsample(x, 6)) == -(-48007 // 6)
    assert np.array_equal(downsample(x, 1), x.astype(np.float32))
    assert len(downsample(np.zeros(0), 6)) == 0
    # An impulse stays where it was (output sample k is input sample 6k).
    impulse = np.zeros(6000)
    impulse[3000] = 1.0
    assert int(np.argmax(downsample(impulse, 6))) == 500


@pytest.mark.parametrize("factor,length", [(2, 9601), (3, 48000), (6, 48007), (6, 50)])
def test_the_block_products_give_the_filter_itself(factor: int, length: int) -> None:
    # The FIR applied sample by sample (a full convolution, centred, every factor-th kept).
    x = np.random.default_rng(factor).standard_normal(length)
    taps = lowpass(factor)
    direct = np.convolve(x, taps)[len(taps) // 2 :][: length : factor]
    y = downsample(x, factor)
    assert y.dtype == np.float32 and len(y) == len(direct)
    assert np.max(np.abs(y - direct)) < 1e-5


@pytest.mark.parametrize("hz", [300.0, 1000.0, 3000.0])
def test_upsampling_keeps_the_band_and_the_timing(hz: float) -> None:
    t = np.arange(8000) / 8000
    y = upsample(np.sin(2 * np.pi * hz * t), 6)
    assert y.dtype == np.float32 and len(y) == 6 * 8000
    expected = np.sin(2 * np.pi * hz * np.arange(len(y)) / RATE)
    inner = slice(1200, -1200)
    assert np.max(np.abs(y[inner] - expected[inner])) < 0.01


def test_upsampling_leaves_no_images_and_keeps_an_impulse_in_place() -> None:
    t = np.arange(8000) / 8000
    y = upsample(np.sin(2 * np.pi * 2000 * t), 6)
    spectrum = np.abs(np.fft.rfft(y[1200:-1200] * np.hanning(len(y) - 2400)))
    freqs = np.fft.rfftfreq(len(y) - 2400, 1 / RATE)
    assert spectrum[freqs > 4400].max() < 1e-3 * spectrum.max()  # 6 kHz, 10 kHz, ... gone
    impulse = np.zeros(1000)
    impulse[400] = 1.0
    assert int(np.argmax(upsample(impulse, 6))) == 2400
    assert len(upsample(np.zeros(0), 6)) == 0
