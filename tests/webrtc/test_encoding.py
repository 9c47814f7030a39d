"""The agent's inline outbound encoder: one packet per 20 ms, and `--opus-complexity` reaching
libopus (a lower complexity is a different, cheaper encoding of the same speech)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.media_agent import AgentSettings
from agent.webrtc.encoding import InlineAudioEncoder
from signaling.__main__ import build_parser, settings_from_args
from tests.support import SPEECH_WAV
from tests.support.opus_quality import decode_opus_at_24k, encode_opus, read_wav_at, snr_db

RATE = 24000


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return read_wav_at(SPEECH_WAV, RATE)


def test_every_20_ms_gives_one_packet_at_every_complexity(speech: np.ndarray) -> None:
    for complexity in (0, 5, 10):
        payloads = encode_opus(speech, RATE, complexity)
        assert len(payloads) == len(speech) // (RATE // 50)
        assert all(payloads)


def test_complexity_changes_the_encoding_not_the_speech(speech: np.ndarray) -> None:
    fast, default = encode_opus(speech, RATE, 0), encode_opus(speech, RATE, 10)
    differing = sum(a != b for a, b in zip(fast, default, strict=False))
    assert differing > len(fast) // 2  # the setting reached libopus
    fast_snr = snr_db(speech, decode_opus_at_24k(fast), RATE)
    default_snr = snr_db(speech, decode_opus_at_24k(default), RATE)
    assert fast_snr > 15 and default_snr > fast_snr


@pytest.mark.parametrize("complexity", [-1, 11])
def test_complexity_outside_0_to_10_is_refused(complexity: int) -> None:
    with pytest.raises(ValueError, match="0-10"):
        InlineAudioEncoder("audio/opus", RATE, opus_complexity=complexity)


def test_the_flag_reaches_the_agent_settings() -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args([])).opus_complexity == 10
    assert settings_from_args(parser.parse_args(["--opus-complexity", "3"])).opus_complexity == 3
    assert AgentSettings().opus_complexity == 10
    for bad in ("11", "-1", "high"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--opus-complexity", bad])
