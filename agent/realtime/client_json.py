"""JSON from clients: decoded with a nesting limit, so depth is a client error, not a crash.

`json.loads` raises RecursionError (not ValueError) on a few thousand nested brackets, and
a structure that decodes just under the interpreter's limit can still blow the stack later
(copying, re-encoding, validating). No event, session or body this server takes nests more
than a few levels, so anything deeper than MAX_DEPTH is refused as malformed.
"""

from __future__ import annotations

import json
from typing import Any

from agent.errors import AgentError

MAX_DEPTH = 32


class ClientJsonError(AgentError, ValueError):
    """Not JSON, or nested too deeply; the message is safe to show the client."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_json", message)


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """True when containers nest more than `limit` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """Decode client JSON; ClientJsonError for malformed or too-deep input."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClientJsonError(exc.msg) from None
    except (RecursionError, UnicodeDecodeError):
        raise ClientJsonError(f"nested more than {max_depth} levels or not UTF-8") from None
    if depth_exceeds(value, max_depth):
        raise ClientJsonError(f"nested more than {max_depth} levels") from None
    return value


def load_object(text: str, noun: str, key: str,
                error: type[AgentError] = AgentError) -> dict[str, Any]:
    """A client message that must be a JSON object with a string `key` (an event's `type`, a
    media-stream message's `event`); `error` with a client-facing code otherwise."""
    article = "an" if noun[:1] in "aeiou" else "a"
    try:
        value = loads(text)
    except ClientJsonError as exc:
        raise error("invalid_json", f"{noun} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise error(f"invalid_{noun}", f"{article} {noun} must be a JSON object")
    if not isinstance(value.get(key), str):
        raise error(f"missing_{key}", f"{article} {noun} needs a string '{key}'", param=key)
    return value
