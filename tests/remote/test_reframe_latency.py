"""Re-framing odd-sized remote audio and matching output frames to input frames."""

from __future__ import annotations

import numpy as np

from agent.plugins.remote.latency import LinkLatency
from agent.plugins.remote.reframe import Reframer


def test_odd_chunks_come_out_as_exact_frames_in_order() -> None:
    reframer = Reframer(1920, max_frames=100)
    signal = np.arange(1920 * 5 + 77, dtype=np.float32)
    position = 0
    for index, size in enumerate([701, 1333, 2011, 97, 1511, 4000, 10]):
        reframer.push(signal[position : position + size], arrived_at=float(index))
        position += size
    frames = []
    while (popped := reframer.pop()) is not None:
        frames.append(popped)
    assert len(frames) == 5
    np.testing.assert_array_equal(np.concatenate([f for f, _ in frames]), signal[: 1920 * 5])
    # A frame's arrival is that of the chunk that completed it.
    assert [t for _, t in frames] == [1.0, 2.0, 5.0, 5.0, 5.0]


def test_the_buffer_is_bounded_oldest_first() -> None:
    reframer = Reframer(4, max_frames=2)
    reframer.push(np.arange(16, dtype=np.float32), 0.0)
    assert reframer.dropped_frames == 2 and reframer.buffered_frames == 2
    popped = reframer.pop()
    assert popped is not None
    np.testing.assert_array_equal(popped[0], [8, 9, 10, 11])
    reframer.push(np.ones(3, dtype=np.float32), 1.0)
    assert reframer.clear() == 4 + 3
    assert reframer.pop() is None


def test_round_trip_matches_the_kth_output_frame_to_the_kth_input() -> None:
    latency = LinkLatency(frame_size=10)
    latency.frames_sent(1, queued_at=0.000, sent_at=0.001)
    latency.frames_sent(1, queued_at=0.080, sent_at=0.082)
    latency.samples_received(7, arrived_at=0.100)  # not a whole frame yet
    assert latency.upstream_rtt.count == 0
    latency.samples_received(13, arrived_at=0.200)  # completes frames 1 and 2
    summary = latency.summary()
    assert summary["upstream_rtt"]["count"] == 2
    assert summary["upstream_rtt"]["max_ms"] == 199.0
    assert summary["upstream_rtt"]["last_ms"] == 118.0
    assert summary["agent_input_hold"]["mean_ms"] == 1.5
    assert summary["agent_added_mean_ms"] is None  # nothing played yet
    latency.output_hold.add(0.004)
    assert latency.summary()["agent_added_mean_ms"] == 5.5


def test_a_standing_backlog_is_trimmed_but_jitter_is_not() -> None:
    reframer = Reframer(4, max_frames=100, patience_ticks=3)
    # Jitter: a frame is sometimes waiting, but the queue empties between: nothing trimmed.
    for tick in range(12):
        reframer.push(np.full(4 if tick % 2 else 8, tick, dtype=np.float32), float(tick))
        reframer.pop()
        if tick % 2:
            reframer.pop()
    assert reframer.trimmed_frames == 0
    # One frame late for good (a missed tick): after 3 ticks one frame is skipped.
    reframer.clear()
    reframer.push(np.zeros(8, dtype=np.float32), 0.0)
    popped = []
    for tick in range(1, 6):
        reframer.push(np.full(4, tick, dtype=np.float32), float(tick))
        frame = reframer.pop()
        assert frame is not None
        popped.append(frame[0][0])
    assert reframer.trimmed_frames == 1
    assert reframer.buffered_frames == 1 and popped == [0.0, 0.0, 2.0, 3.0, 4.0]
