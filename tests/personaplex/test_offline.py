"""The offline CLI end to end, as a user runs it (subprocess), on a tiny checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import av
import numpy as np
import pytest

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]


def _write_input(path: Path, seconds: float, rate: int, channels: int) -> None:
    """A stereo 44.1 kHz (or any) PCM WAV, so the CLI must resample and downmix."""
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)
    samples = np.repeat(tone[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((samples * 32767).astype("<i2").tobytes())


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent.offline", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_offline_end_to_end(tmp_path: Path, tiny_checkpoint: Path) -> None:
    source = tmp_path / "in.wav"
    _write_input(source, seconds=1.0, rate=44100, channels=2)  # 12.5 frames -> 13
    output, text, tokens = tmp_path / "out.wav", tmp_path / "out.txt", tmp_path / "tokens.json"
    result = _run("--plugin", "personaplex", "--model-dir", str(tiny_checkpoint),
                  "--input", str(source), "--output", str(output), "--voice", "NATM1.pt",
                  "--persona", "Be brief.", "--text", str(text), "--tokens", str(tokens))
    assert result.returncode == 0, result.stderr
    with wave.open(str(output)) as wav:
        assert (wav.getframerate(), wav.getnchannels()) == (24000, 1)
        assert wav.getnframes() == 13 * 1920
        audio = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert np.any(audio != 0)
    frames = json.loads(tokens.read_text())["frames"]
    assert len(frames) == 13
    assert all(len(frame["audio"]) == 8 and isinstance(frame["text"], int) for frame in frames)
    assert text.exists()

    # Greedy decoding is deterministic: a second run writes the same tokens.
    again = tmp_path / "tokens2.json"
    result = _run("--model-dir", str(tiny_checkpoint), "--input", str(source),
                  "--output", str(tmp_path / "out2.wav"), "--voice", "NATM1.pt",
                  "--persona", "Be brief.", "--tokens", str(again))
    assert result.returncode == 0, result.stderr
    assert json.loads(again.read_text())["frames"] == frames


def test_offline_moshi_starts_with_silence(tmp_path: Path, tiny_moshi_checkpoint: Path) -> None:
    source = tmp_path / "in.wav"
    _write_input(source, seconds=0.4, rate=24000, channels=1)
    output, tokens = tmp_path / "out.wav", tmp_path / "tokens.json"
    result = _run("--plugin", "moshi", "--model-dir", str(tiny_moshi_checkpoint), "--input",
                  str(source), "--output", str(output), "--tokens", str(tokens), "--sample",
                  "--seed", "3")
    assert result.returncode == 0, result.stderr
    frames = json.loads(tokens.read_text())["frames"]
    assert len(frames) == 5 and frames[0]["audio"] is None and frames[1]["audio"] is not None
    with av.open(str(output)) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert decoded.shape == (5 * 1920,)
    assert not np.any(decoded[:1920])


def test_offline_reports_coded_errors(tmp_path: Path, tiny_checkpoint: Path) -> None:
    source = tmp_path / "in.wav"
    _write_input(source, seconds=0.2, rate=16000, channels=1)
    result = _run("--model-dir", str(tiny_checkpoint), "--input", str(source),
                  "--output", str(tmp_path / "o.wav"), "--voice", "../etc/passwd.pt")
    assert result.returncode == 2 and "invalid_voice" in result.stderr
    result = _run("--model-dir", str(tmp_path / "missing"), "--input", str(source),
                  "--output", str(tmp_path / "o.wav"))
    assert result.returncode == 2 and "model_dir_invalid" in result.stderr


def test_every_missing_or_broken_release_file_gets_its_own_coded_line(
        tmp_path: Path, tiny_checkpoint: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(tiny_checkpoint, partial)
    (partial / "tokenizer_spm_32k_3.model").unlink()
    shutil.rmtree(partial / "voices")
    (partial / "tokenizer-e351c8d8-checkpoint125.safetensors").write_bytes(b"\xff" * 64)
    source = tmp_path / "in.wav"
    _write_input(source, seconds=0.2, rate=16000, channels=1)
    result = _run("--model-dir", str(partial), "--input", str(source),
                  "--output", str(tmp_path / "o.wav"))
    lines = [line for line in result.stderr.splitlines() if line.startswith("error [")]
    assert result.returncode == 2 and len(lines) == 3, result.stderr
    assert all(line.startswith("error [model_dir_invalid]: ") for line in lines)
    assert "Mimi weights" in lines[0] and "not a readable safetensors file" in lines[0]
    assert "tokenizer file 'tokenizer_spm_32k_3.model'" in lines[1]
    assert "no voice prompts" in lines[2]
