"""agent/testing/peer/measure.py: the t0-timeline measurements on recordings with known
timing (delays, jitter, first audio, loss) built here, not on a live call."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.aligned import CallAudio, shared_low_rate
from agent.testing.peer.downsample import downsample
from agent.testing.peer.measure import (
    echo_delay,
    first_loud_time,
    interarrival_jitter,
    measure_into,
)
from agent.testing.peer.recording import Recording
from agent.testing.peer.report import CallReport
from agent.testing.peer.run import channel_speech
from agent.testing.peer.transports.base import PeerCall
from agent.testing.peer.vad import speech_segments
from agent.testing.testsignal import make_test_signal

RATE = 48000
PIECE = 960  # 20 ms


def recorded(samples: np.ndarray, start: float, t0: float = 100.0,
             spacing: list[float] | None = None) -> Recording:
    """A recording of `samples` in 20 ms pieces, the first arriving `start` s after t0."""
    recording = Recording(t0=t0)
    at = t0 + start
    for index in range(0, len(samples), PIECE):
        recording.add_samples(samples[index : index + PIECE], at)
        at += spacing[(index // PIECE) % len(spacing)] if spacing else 0.02
    return recording


@pytest.mark.parametrize("delay_s,received_start", [(0.12, 0.05), (0.25, 0.3), (0.08, 0.0)])
def test_echo_delay_is_read_on_the_t0_timeline(delay_s: float, received_start: float) -> None:
    signal = make_test_signal(3.0)
    sent = recorded(signal, 0.04)
    # The echo arrives `delay_s` after it was sent: its stream starts `received_start` after
    # t0 with as much silence as it takes (negative: the stream began with the echo cut).
    lead = round((0.04 + delay_s - received_start) * RATE)
    echoed = (np.concatenate([np.zeros(lead, np.float32), signal]) if lead >= 0
              else signal[-lead:])
    received = recorded(echoed, received_start)
    delay = echo_delay(sent, received)
    assert delay is not None
    assert delay.delay_ms == pytest.approx(delay_s * 1000, abs=1.0)
    assert delay.correlation > 0.99 and delay.holes == 0


def test_echo_delay_needs_audio_both_ways() -> None:
    assert echo_delay(recorded(make_test_signal(1.0), 0.0), Recording(t0=100.0)) is None


def test_first_loud_time_skips_silence_and_codec_noise() -> None:
    audio = np.concatenate([np.zeros(PIECE * 5, np.float32),
                            np.full(PIECE * 3, 0.003, np.float32),  # below -40 dBFS: noise
                            make_test_signal(0.5)])
    received = recorded(audio, 0.1)
    first = first_loud_time(received)
    assert first is not None
    assert first == pytest.approx(0.1 + 0.02 * 8 + 0.02, abs=0.021)  # the signal's fade-in
    assert first_loud_time(recorded(np.zeros(PIECE * 4, np.float32), 0.0)) is None


def test_jitter_is_zero_for_even_arrivals_and_grows_with_uneven_ones() -> None:
    audio = make_test_signal(2.0)
    even = interarrival_jitter(recorded(audio, 0.0))
    uneven = interarrival_jitter(recorded(audio, 0.0, spacing=[0.01, 0.03]))
    assert even == pytest.approx(0.0, abs=1e-9)
    # Each transit change is 10 ms: RFC 3550's estimate converges on it.
    assert uneven == pytest.approx(0.01, rel=0.05)
    assert interarrival_jitter(Recording()) is None


class FinishedCall(PeerCall):
    """A call that never touches the network: measure_into reads only its fields."""

    transport = "rtp"

    async def connect(self) -> None:
        raise AssertionError("not used")

    async def hangup(self) -> None:
        raise AssertionError("not used")

    async def close(self) -> None:
        return None


def test_measure_into_fills_the_report_from_a_finished_call() -> None:
    call = FinishedCall("rtp://127.0.0.1:4000")
    call.t0 = 100.0
    signal = make_test_signal(2.0)
    call.sent = recorded(signal, 0.02)
    call.received = recorded(np.concatenate([np.zeros(4800, np.float32), signal]), 0.02)
    call.connected_at = 0.01
    call.packets_received, call.packets_lost = 99, 1
    call.add_event({"type": "session.created"}, at=100.5)
    call.add_event({"type": "error", "error": {"code": "x", "message": "y"}}, at=101.0)
    call.mark_ended("hangup")
    report = measure_into(CallReport(), call)
    assert report.connected and report.transport == "rtp"
    assert report.delay_ms == pytest.approx(100.0, abs=1.0)
    assert report.events == ["session.created", "error"]
    assert report.event_times == [0.5, 1.0]
    assert report.errors == [{"code": "x", "message": "y"}]
    assert (report.packets_received, report.packets_lost) == (99, 1)
    assert report.end_reason == "hangup"
    assert report.first_audio_ms is not None and report.first_audio_ms >= 100.0


@pytest.mark.parametrize("sent_start,received_start", [(0.04, 0.2), (0.3, 0.1)])
def test_the_echos_decimated_channels_serve_the_speech_detection(
        sent_start: float, received_start: float) -> None:
    signal = np.concatenate([np.zeros(RATE // 2, np.float32), make_test_signal(2.5),
                             np.zeros(RATE // 2, np.float32)])
    sent = recorded(signal, sent_start)
    received = recorded(np.concatenate([np.zeros(7001, np.float32), signal]), received_start)
    assert echo_delay(sent, received) is not None
    audio = CallAudio.of(sent, received)
    for recording, channel in ((sent, audio.caller), (received, audio.agent)):
        low = shared_low_rate(recording)
        assert low is not None and low.factor == 6
        # It is the timeline itself decimated from sample `low.start`.
        source = (np.concatenate([np.zeros(-low.start, np.float32), channel]) if low.start < 0
                  else channel[low.start :])
        expected = downsample(source, 6)
        count = min(len(expected), len(low.samples))
        assert count > 2 * RATE // 6
        assert np.max(np.abs(low.samples[:count] - expected[:count])) < 1e-5
        shared = channel_speech(recording, len(channel))
        own = speech_segments(channel, RATE)
        assert len(shared) == len(own) == 1
        assert shared[0].start == pytest.approx(own[0].start, abs=0.001)
        assert shared[0].end == pytest.approx(own[0].end, abs=0.001)
