from __future__ import annotations

import numpy as np

from agent.audio.sample_fifo import SampleFifo


def ramp(start: int, count: int) -> np.ndarray:
    return np.arange(start, start + count, dtype=np.float32)


def test_chunks_come_out_in_order_across_pushes() -> None:
    buffer = SampleFifo(capacity_samples=10_000)
    buffer.push(ramp(0, 1920))
    buffer.push(ramp(1920, 1920))
    out = np.concatenate([buffer.pop(480) for _ in range(8)])
    np.testing.assert_array_equal(out, ramp(0, 3840))
    assert buffer.buffered_samples == 0


def test_underrun_returns_none_and_keeps_partial_audio() -> None:
    buffer = SampleFifo(capacity_samples=10_000)
    buffer.push(ramp(0, 300))
    assert buffer.pop(480) is None
    assert buffer.underrun_chunks == 1
    buffer.push(ramp(300, 300))
    np.testing.assert_array_equal(buffer.pop(480), ramp(0, 480))


def test_overflow_drops_oldest_and_counts() -> None:
    buffer = SampleFifo(capacity_samples=1000)
    buffer.push(ramp(0, 800))
    buffer.push(ramp(800, 800))
    assert buffer.buffered_samples == 1000
    assert buffer.dropped_samples == 600
    np.testing.assert_array_equal(buffer.pop(1000), ramp(600, 1000))


def test_clear_drops_everything() -> None:
    buffer = SampleFifo(capacity_samples=10_000)
    buffer.push(ramp(0, 1920))
    buffer.pop(100)
    assert buffer.clear() == 1820
    assert buffer.pop(10) is None


def test_pop_available_returns_what_is_there() -> None:
    buffer = SampleFifo(capacity_samples=10_000)
    assert buffer.pop_available(480) is None
    buffer.push(ramp(0, 300))
    np.testing.assert_array_equal(buffer.pop_available(480), ramp(0, 300))
    buffer.push(ramp(300, 1000))
    buffer.discard(200)
    np.testing.assert_array_equal(buffer.pop_available(100), ramp(500, 100))


def test_peek_leaves_the_samples_queued() -> None:
    fifo = SampleFifo(100)
    fifo.push(np.arange(3, dtype=np.float32))
    fifo.push(np.arange(3, 8, dtype=np.float32))
    fifo.discard(1)
    np.testing.assert_array_equal(fifo.peek(4), [1, 2, 3, 4])
    np.testing.assert_array_equal(fifo.peek(50), [1, 2, 3, 4, 5, 6, 7])
    assert fifo.buffered_samples == 7
    np.testing.assert_array_equal(fifo.pop(7), [1, 2, 3, 4, 5, 6, 7])
    assert len(fifo.peek(3)) == 0
