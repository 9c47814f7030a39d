"""Helpers shared by the tests.

Fixture modules (`agents`, `realtime`, `turn`) are registered once in tests/conftest.py
(`pytest_plugins`), so tests name their fixtures as arguments and never import them. The
rest are imported normally: `from tests.support.server_process import running_server`.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SPEECH_WAV = FIXTURES / "speech_16k.wav"
