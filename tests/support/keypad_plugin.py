"""A test-only plugin: the echo plugin, remembering the DTMF digits the ticker hands it."""

from __future__ import annotations

from agent.plugins.base import PluginSession
from agent.plugins.echo import EchoPlugin


class KeypadEchoPlugin(EchoPlugin):
    id = "keypad-echo"

    def __init__(self) -> None:
        super().__init__()
        self.digits: list[str] = []

    def handle_dtmf(self, session: PluginSession, digit: str) -> None:
        self.digits.append(digit)
