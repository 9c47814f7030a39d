"""PESQ of an echo against what was sent (agent/testing/peer/quality.py), through the ITU
reference code of the `pesq` package, on espeak-ng speech."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from agent.testing.peer.quality import mode_for, score
from agent.testing.peer.script import speak


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        if os.environ.get("CI"):
            pytest.fail("espeak-ng is missing under CI; scripts/install-test-deps.sh installs it")
        pytest.skip("espeak-ng is not installed")
    return speak("The quick brown fox jumps over the lazy dog.", "test")


def on_line(speech: np.ndarray, at: float, seconds: float = 4.0) -> np.ndarray:
    out = np.zeros(int(seconds * 48000), dtype=np.float32)
    start = int(at * 48000)
    out[start : start + len(speech)] = speech[: len(out) - start]
    return out


def test_a_clean_delayed_echo_scores_high_and_its_delay_is_found(speech: np.ndarray) -> None:
    caller, agent = on_line(speech, 0.2), on_line(speech * 0.7, 0.53)
    for mode in ("nb", "wb"):
        quality = score(caller, agent, 48000, mode)
        assert quality.error is None and quality.score is not None and quality.score > 4.0
        assert quality.delay_ms == pytest.approx(330, abs=1)


def test_noise_lowers_the_score(speech: np.ndarray) -> None:
    caller = on_line(speech, 0.2)
    noisy = on_line(speech, 0.3) + np.random.default_rng(3).normal(0, 0.03, len(caller))
    quality = score(caller, noisy.astype(np.float32), 48000, "wb")
    assert quality.score is not None and quality.score < 2.5


def test_no_audio_is_no_score_with_a_reason() -> None:
    silent = np.zeros(48000, dtype=np.float32)
    quality = score(silent, silent, 48000, "nb")
    assert quality.score is None and quality.error == "no audio to compare"


def test_the_mode_follows_the_codec() -> None:
    assert mode_for("opus", "webrtc") == "wb" and mode_for("PCMU", "webrtc") == "nb"
    assert mode_for(None, "media-stream") == "nb" and mode_for(None, "realtime") == "wb"
