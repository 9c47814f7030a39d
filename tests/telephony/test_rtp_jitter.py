"""The RTP jitter buffer: order restored, losses found on their turn, bounded delay."""

from __future__ import annotations

import numpy as np

from agent.telephony.rtp_jitter import Concealer, InboundTicks, JitterBuffer


def _play_all(buffer: JitterBuffer, ticks: int) -> list[bytes | None]:
    """What the leg would push in `ticks` turns (None: conceal); nothing-turns are skipped."""
    out = []
    for _ in range(ticks):
        play, payload = buffer.pop()
        if play:
            out.append(payload)
    return out


def _payload(seq: int) -> bytes:
    return seq.to_bytes(2, "big")


def test_prefetches_then_plays_in_order_across_wraparound() -> None:
    buffer = JitterBuffer(depth=3)
    sequence = [65533, 65535, 65534, 0, 2, 1, 3]  # reordered pairs across the 16-bit wrap
    assert buffer.pop() == (False, None)
    buffer.push(sequence[0], _payload(sequence[0]))
    assert buffer.pop() == (False, None)  # prefetching
    for seq in sequence[1:]:
        buffer.push(seq, _payload(seq))
    played = _play_all(buffer, 10)
    assert played == [_payload(s) for s in (65533, 65534, 65535, 0, 1, 2, 3)]
    assert buffer.stats.reordered == 2 and buffer.stats.lost == 0 and buffer.stats.late == 0


def test_a_lost_packet_is_concealed_on_its_turn_and_a_late_one_dropped() -> None:
    buffer = JitterBuffer(depth=2)
    for seq in (10, 11, 13, 14):
        buffer.push(seq, _payload(seq))
    played = _play_all(buffer, 4)
    assert played == [_payload(10), _payload(11), None, _payload(13)]
    buffer.push(12, _payload(12))  # its turn has passed
    assert buffer.stats.late == 1 and buffer.stats.lost == 1
    assert _play_all(buffer, 3) == [_payload(14)]
    assert buffer.stats.underruns == 1  # empty after 14: playout stops and prefetches again


def test_an_earlier_packet_during_prefetch_is_still_played() -> None:
    buffer = JitterBuffer(depth=3)
    buffer.push(101, _payload(101))
    buffer.push(100, _payload(100))
    buffer.push(102, _payload(102))
    assert _play_all(buffer, 4) == [_payload(100), _payload(101), _payload(102)]
    assert buffer.stats.late == 0


def test_duplicates_are_dropped() -> None:
    buffer = JitterBuffer(depth=1)
    buffer.push(5, _payload(5))
    buffer.push(5, _payload(5))
    assert _play_all(buffer, 3) == [_payload(5)]
    assert buffer.stats.late == 1


def test_a_burst_is_skipped_down_to_the_depth() -> None:
    buffer = JitterBuffer(depth=2, max_span=6)
    for seq in range(20):
        buffer.push(seq, _payload(seq))
    played = _play_all(buffer, 3)
    assert played[0] == _payload(18)  # 20 held > 6: skip to keep `depth` packets of delay
    assert buffer.stats.skipped == 18


def test_a_jump_or_new_stream_resyncs() -> None:
    buffer = JitterBuffer(depth=1)
    buffer.push(1000, _payload(1000))
    assert _play_all(buffer, 1) == [_payload(1000)]
    buffer.push(30000, _payload(30000))  # far away: the sender restarted its sequence
    assert _play_all(buffer, 2) == [_payload(30000)]
    assert buffer.stats.resyncs == 1


def test_concealer_repeats_fading_then_silence() -> None:
    concealer = Concealer(160)
    assert np.array_equal(concealer.fill(None), np.zeros(160, np.int16))  # nothing to repeat
    voice = np.full(160, 1000, dtype=np.int16)
    assert np.array_equal(concealer.fill(voice), voice)
    assert np.all(concealer.fill(None) == 500)
    assert np.all(concealer.fill(None) == 250)
    assert np.all(concealer.fill(None) == 0)
    assert np.array_equal(concealer.fill(voice), voice)
    assert np.all(concealer.fill(None) == 500)


def _ramp_packets(sizes: list[int]) -> list[np.ndarray]:
    """Consecutive int16 sample numbers cut into packets of the given sizes."""
    packets, start = [], 0
    for size in sizes:
        packets.append(np.arange(start, start + size, dtype=np.int16))
        start += size
    return packets


def _decode(payload: bytes) -> np.ndarray:
    return np.frombuffer(payload, dtype=np.int16)


def test_any_packet_duration_plays_as_exact_continuous_ticks() -> None:
    # 10, 23.1 (ffmpeg's 185), 30, 60 ms packets, and a ptime change mid-stream.
    for sizes in ([80] * 60, [185, 186] * 20, [240] * 20, [480] * 10, [160] * 10 + [240] * 10):
        playout = InboundTicks(JitterBuffer(3), Concealer(160), 160, 480)
        packets = _ramp_packets(sizes)
        played: list[np.ndarray] = []
        arrived, seq = 0, 0
        for tick in range(400):
            # Packets arrive when their audio has been produced: at 8 samples per ms.
            while packets and arrived + len(packets[0]) <= (tick + 1) * 160:
                arrived += len(packets[0])
                playout.note_packet_samples(len(packets[0]))
                playout.buffer.push(seq, packets.pop(0).tobytes())
                seq += 1
            chunk = playout.tick(_decode)
            if chunk is not None:
                played.append(chunk)
        lengths = [len(chunk) for chunk in played]
        assert set(lengths[:-1]) == {160}, (sizes[:2], lengths)
        audio = np.concatenate(played)
        assert np.array_equal(audio, np.arange(len(audio), dtype=np.int16)), sizes[:2]
        assert len(audio) == sum(sizes)
        assert playout.packet_samples in sizes


def test_depth_follows_the_typical_packet_duration_not_an_odd_one() -> None:
    playout = InboundTicks(JitterBuffer(3), Concealer(160), 160, 480)
    for size in [240] * 5 + [16]:
        playout.note_packet_samples(size)
    assert playout.packet_samples == 240
    assert playout.buffer.depth == 2 and playout.buffer.prefetch_ticks == 3
    assert playout.packet_sizes_seen == [16, 240]


def test_a_flood_between_two_ticks_is_bounded_in_packets_and_bytes() -> None:
    buffer = JitterBuffer(depth=3)
    for seq in range(200):  # distinct numbers within the resync gap, and no tick between
        buffer.push(seq, bytes(2000))
        assert buffer.held <= buffer.max_held
    assert buffer.held == buffer.max_held == 2 * buffer.max_span + 8
    assert buffer.held_bytes == 2000 * buffer.held
    assert buffer.stats.overflow == 200 - buffer.max_held and buffer.stats.resyncs == 0
    # The oldest went first: playout skips ahead to the newest, as after any burst.
    played = [p for p in _play_all(buffer, 30) if p is not None]
    assert played and len(played) <= buffer.max_span
    assert buffer.held == 0 and buffer.held_bytes == 0

    small = JitterBuffer(depth=50, max_held_bytes=10_000)  # a deep buffer: bytes bind first
    for seq in range(100):
        small.push(seq, bytes(1000))
        assert small.held_bytes <= 10_000
    assert small.held == 10 and small.stats.overflow == 90


def test_reset_lets_go_of_everything_held() -> None:
    playout = InboundTicks(JitterBuffer(3), Concealer(160), 160, 480)
    for seq in range(5):
        playout.buffer.push(seq, bytes(320))
    assert playout.tick(lambda payload: np.ones(len(payload), dtype=np.int16)) is not None
    playout.reset()
    assert playout.buffer.held == 0 and playout.buffer.held_bytes == 0
    assert playout.tick(lambda payload: np.ones(len(payload), dtype=np.int16)) is None
    assert playout.concealer.fill(None).tolist() == [0] * 160  # no last packet to repeat
