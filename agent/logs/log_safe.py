"""Client strings made safe to put in a log line.

Event names, stream and call ids, option keys and paths come from clients. Written raw, a
newline or carriage return lets a client forge whole log records ("...\\n2026-01-01 INFO
call ok"), and escape sequences can rewrite a terminal. `printable` escapes every control
and line-breaking character (C0, DEL, C1, U+2028/2029, bidi overrides) the way Python's
string literals do, and bounds the length.

A client can also make the server log once per message it sends. `LogThrottle` lets one
such line through per interval and counts the ones it holds back, so a flood costs one line
a second (with how many were held back) and a summary at the end, not a line per message.
"""

from __future__ import annotations

import re

from agent.audio.clock import Clock, MonotonicClock

MAX_LOGGED_CHARS = 200
# C0 controls, DEL, C1 controls, line/paragraph separators, bidi embeddings/overrides/isolates.
_CONTROLS = "\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_CONTROLS}\\\\]")
_CONTROL = re.compile(f"[{_CONTROLS}]")


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if char == "\\":
        return "\\\\"  # so an escaped \n and a literal backslash-n stay distinguishable
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
    if named:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object, limit: int | None = MAX_LOGGED_CHARS, *,
              backslashes: bool = True) -> str:
    """`value` as one safe log token: control characters escaped, at most `limit` chars.
    `backslashes=False` leaves backslashes alone (for whole log lines, not client tokens)."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"...({len(text) - limit} more)"
    return (_UNSAFE if backslashes else _CONTROL).sub(_escape, text)


class LogThrottle:
    """One log line per `interval` seconds for one source (a stream, a leg); counts the rest.

    `admit()` says whether to write this line: None to hold it back (it is counted), or the
    number held back since the last line written (0 when none), for the line to mention.
    `take_held_back()` hands over what is still unreported, for a summary when the source ends.
    """

    def __init__(self, interval: float = 1.0, clock: Clock | None = None) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self._clock = clock or MonotonicClock()
        self._quiet_until: float | None = None
        self._held_back = 0

    def admit(self) -> int | None:
        now = self._clock.now()
        if self._quiet_until is not None and now < self._quiet_until:
            self._held_back += 1
            return None
        self._quiet_until = now + self.interval
        return self.take_held_back()

    def take_held_back(self) -> int:
        held, self._held_back = self._held_back, 0
        return held


def held_back_note(count: int, what: str = "lines") -> str:
    """The tail of a throttled line: how many like it were not logged since the last one."""
    return f" ({count} more {what} not logged since the last line)" if count else ""
