"""agent/testing/peer/downsample.py: the pass band kept in time (zero phase), the band above
the new Nyquist frequency removed, any length."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.downsample import downsample

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
    assert np.array_equal(downsample(x, 1), x)
    assert len(downsample(np.zeros(0), 6)) == 0
    # An impulse stays where it was (output sample k is input sample 6k).
    impulse = np.zeros(6000)
    impulse[3000] = 1.0
    assert int(np.argmax(downsample(impulse, 6))) == 500
