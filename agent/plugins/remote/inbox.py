"""What arrived from a remote engine: filed on the event loop, taken on the ticker thread.

deque append/popleft are atomic, so the two threads share it without a lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from agent.plugins.base import PluginError

AudioSink = Callable[[Any, float], None]  # (payload, arrived_at), on the ticker thread


class LinkInbox:
    def __init__(self) -> None:
        # ("audio", payload, arrived_at) | ("text", str) | ("segment_end",) | ("notice", error)
        self._entries: deque[tuple[Any, ...]] = deque()
        self._text: list[str] = []
        self._segment_end = False
        self._notices: deque[PluginError] = deque()
        self.notices_received = 0

    # -- loop -------------------------------------------------------------------------------

    def audio(self, payload: Any, arrived_at: float) -> None:
        self._entries.append(("audio", payload, arrived_at))

    def text(self, text: str) -> None:
        self._entries.append(("text", text))

    def segment_end(self) -> None:
        self._entries.append(("segment_end",))

    def notice(self, error: PluginError) -> None:
        self.notices_received += 1
        self._entries.append(("notice", error))

    # -- ticker thread ----------------------------------------------------------------------

    def drain(self, on_audio: AudioSink) -> None:
        """Hand every audio payload to `on_audio` in order; keep text, ends and notices for
        `take`. Whatever `on_audio` raises stops the drain there."""
        while self._entries:
            entry = self._entries.popleft()
            kind = entry[0]
            if kind == "audio":
                on_audio(entry[1], entry[2])
            elif kind == "text":
                self._text.append(entry[1])
            elif kind == "segment_end":
                self._segment_end = True
            elif kind == "notice":
                self._notices.append(entry[1])

    def take(self) -> tuple[str, bool, PluginError | None]:
        """This frame's text, whether a segment ended, and at most one notice."""
        text = "".join(self._text)
        self._text.clear()
        segment_end, self._segment_end = self._segment_end, False
        notice = self._notices.popleft() if self._notices else None
        return text, segment_end, notice

    def clear_text(self) -> None:
        self._text.clear()
