"""agent/testing/peer/echo.py: the peer's cheap echo measurement gives what
`testsignal.measure_echo` gives on the same audio (delays, a dropped frame, a hole, noise), and
hands back the channels as it decimated them."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.downsample import downsample
from agent.testing.peer.echo import measure, measure_keeping
from agent.testing.testsignal import make_test_signal, measure_echo

RATE = 48000
FRAME = 960  # 20 ms


def echoed(signal: np.ndarray, delay: int, drop_at: int | None = None,
           hole: tuple[int, int] | None = None, noise: float = 0.0) -> np.ndarray:
    out = np.concatenate([np.zeros(delay, np.float32), signal])
    if drop_at is not None:  # a frame the path dropped: what follows comes 20 ms early
        out = np.concatenate([out[:drop_at], out[drop_at + FRAME :]])
    if hole is not None:  # a stretch that never came back
        out[hole[0] : hole[1]] = 0
    if noise:
        out = out + noise * np.random.default_rng(5).standard_normal(len(out)).astype(
            np.float32)
    return out.astype(np.float32)


@pytest.mark.parametrize("case", [
    {"delay": 12345},
    {"delay": 4801, "drop_at": 200000},
    {"delay": 30000, "hole": (150000, 170000)},
    {"delay": 7777, "noise": 0.05},
    {"delay": 1000, "hole": (100000, 130000)},
], ids=["plain", "dropped-frame", "hole", "noise", "window-long-hole"])
def test_it_agrees_with_the_reference_measurement(case: dict) -> None:
    sent = make_test_signal(5.0)[:-7]  # a length with an awkward prime factor
    received = echoed(sent, **case)
    reference = measure_echo(sent, received, RATE)
    cheap = measure(sent, received, RATE)
    assert cheap.lag_seconds == pytest.approx(reference.lag_seconds, abs=1 / RATE)
    assert cheap.correlation == pytest.approx(reference.correlation, abs=0.01)
    assert (cheap.windows, cheap.holes) == (reference.windows, reference.holes)
    if reference.holes == 0:
        assert cheap.lag_spread_seconds == pytest.approx(reference.lag_spread_seconds, abs=1e-9)
    else:  # a hole has no lag of its own: the spread is of the windows that came back
        assert cheap.lag_spread_seconds == 0.0


def test_a_dropped_frame_and_a_hole_show() -> None:
    sent = make_test_signal(5.0)
    dropped = measure(sent, echoed(sent, 4800, drop_at=150000), RATE)
    assert dropped.lag_spread_seconds == pytest.approx(0.02) and dropped.holes == 0
    holed = measure(sent, echoed(sent, 4800, hole=(100000, 130000)), RATE)
    assert holed.holes >= 1 and holed.correlation < 0.99
    assert holed.matched > max(0.95, holed.correlation)  # the windows that came back match


def test_nothing_to_measure() -> None:
    assert measure(np.zeros(0, np.float32), make_test_signal(1.0), RATE).correlation == 0.0
    silent = measure(make_test_signal(2.0), np.zeros(RATE * 3, np.float32), RATE)
    assert silent.correlation < 0.5


@pytest.mark.parametrize("delay", [4800, 4801, 4805])
def test_the_decimated_channels_come_back_with_where_they_start(delay: int) -> None:
    sent = make_test_signal(3.0)
    received = echoed(sent, delay)
    echo, decimated = measure_keeping(sent, received, RATE)
    assert decimated is not None and decimated.factor == 6
    assert round(echo.lag_seconds * RATE) == delay
    # `received` is decimated from the sample that makes the lag whole at 8 kHz.
    assert decimated.received_from == delay % 6
    assert np.array_equal(decimated.sent, downsample(sent, 6))
    assert np.array_equal(decimated.received, downsample(received[delay % 6 :], 6))
    assert measure_keeping(sent[:0], received, RATE)[1] is None
