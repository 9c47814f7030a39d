"""Recordings laid on the call's t0 timeline (agent/testing/peer/aligned.py): jitter absorbed,
real pauses kept, both channels the same length; the layout computed run by run gives the
piece-by-piece rule's; the low-rate audio shared only where the timeline is the joined audio."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.aligned import (
    JUMP_SECONDS,
    CallAudio,
    has_jumps,
    on_timeline,
    sample_starts,
    share_low_rate,
    shared_low_rate,
)
from agent.testing.peer.recording import Recording

CHUNK = 960  # 20 ms at 48 kHz


def recording(arrivals: list[float], value: float = 1.0) -> Recording:
    rec = Recording(t0=100.0)
    for at in arrivals:
        rec.add_samples(np.full(CHUNK, value, dtype=np.float32), 100.0 + at)
    return rec


def test_jittered_pieces_play_back_to_back_from_the_first_arrival() -> None:
    samples = on_timeline(recording([0.5, 0.523, 0.538, 0.565]))
    assert len(samples) == 24000 + 4 * CHUNK
    assert not samples[:24000].any() and samples[24000:].all()


def test_a_real_pause_stays_a_pause() -> None:
    samples = on_timeline(recording([0.0, 0.02, 0.5]))
    assert samples[: 2 * CHUNK].all()
    assert not samples[2 * CHUNK : 24000].any() and samples[24000 : 24000 + CHUNK].all()


def test_both_channels_share_one_length_and_make_a_stereo_pair() -> None:
    audio = CallAudio.of(recording([0.0, 0.02], 0.5), recording([0.1], -0.25))
    assert len(audio.caller) == len(audio.agent) == 4800 + CHUNK
    stereo = audio.stereo()
    assert stereo.shape == (len(audio.caller), 2)
    assert stereo[0, 0] == 0.5 and stereo[4800, 1] == -0.25


def sequential_starts(recording: Recording) -> list[int]:
    """The rule, one piece at a time: right after the previous piece unless it arrived more
    than JUMP_SECONDS later than that, then at its arrival."""
    starts: list[int] = []
    end = 0
    for index, (at, chunk) in enumerate(zip(recording.times(), recording.chunks, strict=False)):
        arrival = max(0, int(round(at * recording.rate)))
        jumped = arrival - end > JUMP_SECONDS * recording.rate
        start = arrival if index == 0 or jumped else end
        starts.append(start)
        end = start + len(chunk)
    return starts


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorised_layout_follows_the_rule_piece_by_piece(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rec = Recording(t0=100.0)
    at = 100.0 + rng.uniform(-0.01, 0.5)
    for _ in range(int(rng.integers(1, 2500))):  # past one vectorised step (WINDOW pieces)
        length = int(rng.choice([960, 480, 160, 0, 1920]))
        rec.add_samples(np.zeros(length, np.float32), at)
        at += length / 48000 + rng.choice([0.0, 0.001, -0.002, 0.0595, 0.061, 0.3],
                                          p=[0.55, 0.2, 0.1, 0.05, 0.05, 0.05])
    assert sample_starts(rec) == sequential_starts(rec)


def test_without_jumps_the_timeline_is_the_joined_audio_and_shares_its_low_rate() -> None:
    rec = recording([0.5, 0.523, 0.538, 0.565], 0.5)
    assert not has_jumps(rec)
    timeline = on_timeline(rec)
    assert np.array_equal(timeline[24000:], rec.joined()) and not timeline.flags.writeable
    low = np.ones(10, np.float32)
    share_low_rate(rec, low, -3, 6)
    shared = shared_low_rate(rec)
    assert shared is not None and shared.start == 24000 - 3 and shared.factor == 6
    rec.add_samples(np.ones(CHUNK, np.float32), 100.6)  # the recording changed
    assert shared_low_rate(rec) is None


def test_with_a_jump_nothing_is_shared() -> None:
    rec = recording([0.0, 0.02, 0.5])
    assert has_jumps(rec)
    share_low_rate(rec, np.ones(10, np.float32), 0, 6)
    assert shared_low_rate(rec) is None
