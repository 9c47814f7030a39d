"""`python -m agent.offline` start-up mistakes: one coded line, exit 2, before any model loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.testing.peer import save_wav
from agent.testing.testsignal import make_test_signal


@pytest.mark.parametrize("input_name,output,code", [
    ("missing.wav", "out.wav", "input_not_found"),
    ("bad.wav", "out.wav", "input_unreadable"),
    ("good.wav", "no/such/folder/out.wav", "output_unwritable"),
])
def test_mistakes_are_one_line_without_errno_or_traceback(
    tmp_path: Path, input_name: str, output: str, code: str
) -> None:
    (tmp_path / "bad.wav").write_text("not audio")
    save_wav(str(tmp_path / "good.wav"), make_test_signal(0.5))
    # The model folder is empty: every mistake here is found before the model would load.
    result = subprocess.run(
        [sys.executable, "-m", "agent.offline", "--model-dir", str(tmp_path),
         "--input", str(tmp_path / input_name), "--output", str(tmp_path / output)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]: "), result.stderr
    assert "Errno" not in result.stderr and "Traceback" not in result.stderr
