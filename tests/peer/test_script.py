"""Scripts (agent/testing/peer/script.py): YAML or JSON, checked against script_schema.json,
audio prepared before any call; every mistake one coded line naming the file and step."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from agent.cli_errors import CliError
from agent.testing.peer import script as scripts
from agent.testing.peer.wav import save_wav
from tests.peer.speech import bursts


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def failure(path: str) -> CliError:
    with pytest.raises(CliError) as caught:
        scripts.load(path)
    assert "\n" not in caught.value.message
    return caught.value


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(scripts.schema())


def test_a_yaml_script_with_every_step_loads(tmp_path: Path) -> None:
    save_wav(str(tmp_path / "hi.wav"), bursts([(0.1, 0.5)], 0.6))
    path = write(tmp_path, """
name: full
transport: webrtc
session: {voice: NATF2.pt}
steps:
  - play: hi.wav
  - expect_speech: {within: 1.5}
  - expect_speech
  - barge_in: {after_speech_starts: 0.3, expect_stop_within_ms: 400, play: hi.wav}
  - dtmf: "12#"
  - session_update: {instructions: be brief}
  - expect_event: {type: session.updated, within: 2}
  - expect_transcript: {contains: hello, within: 3}
  - silence: 2.0
  - hangup
  - expect_hangup: {within: 4}
""")
    script = scripts.load(path)
    assert script.name == "full" and script.transport == "webrtc"
    assert script.session == {"voice": "NATF2.pt"}
    kinds = [step.kind for step in script.steps]
    assert kinds == ["play", "expect_speech", "expect_speech", "barge_in", "dtmf",
                     "session_update", "expect_event", "expect_transcript", "silence",
                     "hangup", "expect_hangup"]
    assert script.steps[0].audio is not None and len(script.steps[0].audio) == 28800
    assert script.steps[3].audio is not None
    assert script.steps[1].args == {"within": 1.5} and script.steps[2].args == {}
    assert script.steps[4].args == {"value": "12#"} and script.steps[8].args == {"value": 2.0}
    assert script.steps[5].args == {"instructions": "be brief"}


def test_a_json_list_of_steps_is_a_script_named_after_its_file(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{"silence": 0.5}, "hangup"]), "quick.json")
    script = scripts.load(path)
    assert script.name == "quick" and [s.kind for s in script.steps] == ["silence", "hangup"]


@pytest.mark.parametrize("text,code,words", [
    ("- play_file: a.wav\n", "unknown_step", ["step 1", "'play_file'", "known: play"]),
    ("steps:\n  - silence: 1\n  - wait: 2\n", "unknown_step", ["step 2", "'wait'"]),
    ("- silence: -1\n", "invalid_script", ["step 1", "minimum"]),
    ("- expect_speech: {within: soon}\n", "invalid_script", ["step 1", "soon"]),
    ("- dtmf: '12x'\n", "invalid_script", ["step 1", "12x"]),
    ("- barge_in: {after_speech_starts: 0.3}\n", "invalid_script", ["step 1"]),
    ("- expect_event: {within: 2}\n", "invalid_script", ["step 1", "'type'"]),
    ("- play\n", "invalid_script", ["step 1", "play needs an argument"]),
    ("- {silence: 1, hangup: null}\n", "invalid_script", ["step 1", "one name"]),
    ("steps: []\n", "invalid_script", ["steps"]),
    ("steps: [hangup]\ncolour: red\n", "invalid_script", ["colour"]),
    ("steps: [\n", "invalid_script", ["line"]),
])
def test_a_bad_script_is_one_coded_line(tmp_path: Path, text: str, code: str,
                                        words: list[str]) -> None:
    error = failure(write(tmp_path, text))
    assert error.code == code, error.message
    assert error.message.startswith(str(tmp_path / "s.yaml"))
    for word in words:
        assert word in error.message


def test_a_missing_or_unreadable_wav_names_the_step(tmp_path: Path) -> None:
    error = failure(write(tmp_path, "- silence: 1\n- play: nowhere.wav\n"))
    assert error.code == "wav_not_found"
    assert "step 2 (play)" in error.message and "nowhere.wav" in error.message
    (tmp_path / "bad.wav").write_text("not audio")
    error = failure(write(tmp_path, "- barge_in: {play: bad.wav}\n"))
    assert error.code == "wav_unreadable" and "step 1 (barge_in)" in error.message


def test_a_missing_script_file() -> None:
    error = failure("/no/such/script.yaml")
    assert error.code == "script_not_found"


def test_say_without_espeak_ng_is_a_clear_error(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no espeak-ng on this PATH
    error = failure(write(tmp_path, "- say: hello\n"))
    assert error.code == "espeak_missing" and "apt-get install espeak-ng" in error.message


def test_say_speaks_the_text_with_espeak_ng(tmp_path: Path) -> None:
    if shutil.which("espeak-ng") is None:
        if os.environ.get("CI"):
            pytest.fail("espeak-ng is missing under CI; scripts/install-test-deps.sh installs it")
        pytest.skip("espeak-ng is not installed")
    script = scripts.load(write(tmp_path, "- say: hello there\n"))
    audio = script.steps[0].audio
    assert audio is not None and 0.5 < len(audio) / 48000 < 3
    assert float(np.sqrt(np.mean(audio**2))) > 0.01
