"""Speech segments from webrtcvad (agent/testing/peer/vad.py): edges refined to the sample,
pauses bridged, clicks dropped, the same segments from 8 kHz audio handed in, and the online
tracker's onsets."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.downsample import downsample
from agent.testing.peer.vad import SpeechTracker, mask_segments, segments_of, speech_segments
from tests.peer.speech import RATE, bursts, padded, sharp_burst


def test_bursts_come_out_as_segments_near_their_edges() -> None:
    audio = bursts([(0.5, 1.3), (2.0, 2.6)], 3.2)
    segments = speech_segments(audio, RATE)
    assert len(segments) == 2
    for segment, (start, end) in zip(segments, [(0.5, 1.3), (2.0, 2.6)], strict=True):
        # The test signal fades in and out over 100 ms; the detector hears it early in the
        # fade-in and until late in the fade-out.
        assert segment.start == pytest.approx(start, abs=0.03)
        assert segment.end == pytest.approx(end, abs=0.03)


def test_onsets_follow_the_audio_by_the_millisecond_not_by_the_frame() -> None:
    # Shifting the audio by less than one 10 ms frame moves the onset by as much.
    onsets = []
    for shift_ms in (0.0, 3.3, 6.6):
        shift = shift_ms / 1000
        audio = bursts([(0.5 + shift, 1.3 + shift)], 2.0)
        onsets.append(speech_segments(audio, RATE)[0].start - shift)
    assert max(onsets) - min(onsets) < 0.003


@pytest.mark.parametrize("at", [0.3, 0.30137, 0.30713])
def test_sharp_edges_are_found_to_the_sample_not_to_the_frame(at: float) -> None:
    # A burst with 5 ms edges at an arbitrary sample: the detector's 10 ms frames put its
    # edges up to a frame outside; the refined edges are within a millisecond.
    audio = np.zeros(int(1.5 * RATE), dtype=np.float32)
    burst = sharp_burst(0.4)
    start = int(at * RATE)
    audio[start : start + len(burst)] = burst
    (segment,) = speech_segments(audio, RATE)
    assert segment.start == pytest.approx(start / RATE, abs=0.001)
    assert segment.end == pytest.approx(start / RATE + 0.4, abs=0.001)


def test_an_edge_over_a_noise_floor_keeps_the_detectors_position() -> None:
    # Noise 20 dB under the speech never drops 30 dB below it: nothing to refine to, and the
    # edge stays where the detector put it (within its 10 ms frame and a bit).
    floor = np.random.default_rng(3).standard_normal(int(1.6 * RATE)).astype(np.float32)
    audio = padded(sharp_burst(0.4), 0.6) + floor * 0.025
    segments = speech_segments(audio, RATE)
    assert len(segments) == 1
    assert segments[0].start == pytest.approx(0.6, abs=0.03)


def test_silence_and_digital_silence_have_no_speech() -> None:
    assert speech_segments(np.zeros(RATE * 2, dtype=np.float32), RATE) == []
    quiet = (np.random.default_rng(1).standard_normal(RATE * 2) * 1e-5).astype(np.float32)
    assert speech_segments(quiet, RATE) == []


def test_an_offset_lands_the_segment_on_the_call_timeline() -> None:
    segments = speech_segments(bursts([(0.2, 0.8)], 1.0), RATE, offset=10.0)
    assert segments[0].start == pytest.approx(10.2, abs=0.03)


def test_short_pauses_are_bridged_and_clicks_dropped() -> None:
    mask = np.zeros(2000, dtype=bool)
    mask[100:400] = True
    mask[500:800] = True  # 100 ms pause: one utterance
    mask[1200:1230] = True  # 30 ms: a click
    segments = mask_segments(mask)
    assert [(s.start, s.end) for s in segments] == [(0.1, 0.8)]


def test_the_tracker_hears_onsets_and_offsets_as_audio_arrives() -> None:
    audio = bursts([(0.5, 1.3), (2.0, 2.6)], 3.4)
    tracker = SpeechTracker(RATE)
    for start in range(0, len(audio), 960):
        tracker.feed(audio[start : start + 960])
    assert tracker.onsets == pytest.approx([0.5, 2.0], abs=0.04)
    assert len(tracker.offsets) == 2 and tracker.offsets[0] == pytest.approx(1.3, abs=0.06)
    assert not tracker.speaking


def test_a_rate_the_detector_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 8000"):
        speech_segments(np.zeros(44100, dtype=np.float32), 44100)


@pytest.mark.parametrize("low_start", [0, 5, -3, 1201])
def test_handed_in_8khz_audio_gives_the_same_segments(low_start: int) -> None:
    # What the echo measurement decimated (from any sample, even before the first) serves
    # the detector; the refined edges land where the detector's own decimation puts them.
    audio = bursts([(0.5, 1.3), (2.0, 2.6)], 3.2)
    own = speech_segments(audio, RATE)
    source = (np.concatenate([np.zeros(-low_start, np.float32), audio]) if low_start < 0
              else audio[low_start:])
    given = segments_of(downsample(source, 6), audio, RATE, low_start)
    assert len(given) == len(own) == 2
    for a, b in zip(given, own, strict=True):
        assert a.start == pytest.approx(b.start, abs=0.001)
        assert a.end == pytest.approx(b.end, abs=0.001)


def test_an_utterance_end_late_in_a_long_call_is_found() -> None:
    # Two long utterances half a second apart: the pause between them and the end of the
    # last one are found where they are.
    audio = bursts([(0.3, 6.0), (6.5, 9.4)], 10.0)
    segments = speech_segments(audio, RATE)
    assert [(round(s.start, 1), round(s.end, 1)) for s in segments] == [(0.3, 6.0), (6.5, 9.4)]
