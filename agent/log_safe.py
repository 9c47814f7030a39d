"""Client strings made safe to put in a log line.

Event names, stream and call ids, option keys and paths come from clients. Written raw, a
newline or carriage return lets a client forge whole log records ("...\\n2026-01-01 INFO
call ok"), and escape sequences can rewrite a terminal. `printable` escapes every control
and line-breaking character (C0, DEL, C1, U+2028/2029, bidi overrides) the way Python's
string literals do, and bounds the length.
"""

from __future__ import annotations

import re

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
