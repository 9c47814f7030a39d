"""Server events on the data channel, in the OpenAI Realtime shape."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

from agent.errors import AgentError
from agent.realtime import client_json

log = logging.getLogger(__name__)

MAX_CLIENT_EVENT_BYTES = 64 * 1024

Send = Callable[[str], None]  # a message channel's send (an RTCDataChannel's, a websocket's)


def event_id() -> str:
    return "event_" + secrets.token_hex(8)


def server_event(event_type: str, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, "event_id": event_id(), **fields}


def error_event(
    code: str,
    message: str,
    *,
    param: str | None = None,
    client_event_id: str | None = None,
    error_type: str = "invalid_request_error",
) -> dict[str, Any]:
    return server_event(
        "error",
        error={
            "type": error_type,
            "code": code,
            "message": message,
            "param": param,
            "event_id": client_event_id,
        },
    )


def error_event_from(exc: AgentError, client_event_id: str | None = None) -> dict[str, Any]:
    error_type = "server_error" if exc.status >= 500 else "invalid_request_error"
    return error_event(
        exc.code, exc.message, param=exc.param, client_event_id=client_event_id,
        error_type=error_type,
    )


class EventChannel:
    """A JSON event pipe over an RTCDataChannel (or anything with `send(str)`).

    Events sent before a channel is attached are dropped: the channel is optional and a
    call works without one.
    """

    def __init__(self) -> None:
        self._send: Send | None = None

    def attach(self, send: Send) -> None:
        self._send = send

    def detach(self) -> None:
        self._send = None

    @property
    def attached(self) -> bool:
        return self._send is not None

    def send(self, event: dict[str, Any]) -> None:
        if self._send is None:
            return
        try:
            self._send(json.dumps(event))
        except ValueError as exc:
            # Over the peer's max-message-size (an event echoing 64 KiB of instructions to a
            # peer that takes no more): this event is lost, the channel is not.
            log.warning("data channel: %s event not sent: %s", event.get("type"), exc)
            if event.get("type") != "error":
                self.send(error_event(
                    "event_too_large", f"a {event.get('type')} event was too large for this "
                    "data channel's max-message-size and was not sent",
                    error_type="server_error"))
        except Exception as exc:  # a closing channel must not break the media path
            log.debug("data channel send failed: %s", exc)
            self._send = None


def parse_client_event(raw: str | bytes) -> dict[str, Any]:
    """Decode one client event or raise AgentError with the code the client should see."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_CLIENT_EVENT_BYTES:
            raise AgentError("message_too_large", "events are limited to 64 KiB")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise AgentError("invalid_json", "events must be UTF-8 JSON text") from None
    if len(raw.encode("utf-8")) > MAX_CLIENT_EVENT_BYTES:
        raise AgentError("message_too_large", "events are limited to 64 KiB")
    event = client_json.load_object(raw, "event", "type")
    client_event_id = event.get("event_id")
    if client_event_id is not None and not isinstance(client_event_id, str):
        raise AgentError("invalid_type", "'event_id' must be a string", param="event_id")
    return event


def peek_event_id(raw: str | bytes) -> str | None:
    """The client's `event_id` from an event that failed validation, to echo on the error."""
    if len(raw) > MAX_CLIENT_EVENT_BYTES:
        return None
    try:
        event = client_json.loads(raw)
    except client_json.ClientJsonError:
        return None
    if isinstance(event, dict) and isinstance(event.get("event_id"), str):
        return event["event_id"]
    return None
