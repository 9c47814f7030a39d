"""Recordings laid on the call's t0 timeline (agent/testing/peer/aligned.py): jitter absorbed,
real pauses kept, both channels the same length."""

from __future__ import annotations

import numpy as np

from agent.testing.peer.aligned import CallAudio, on_timeline
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
