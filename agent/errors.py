"""Errors as data: every refusal the agent makes carries a machine-readable code.

`AgentError` is the one root. Transports turn it into what their peer understands in one
place each: an HTTP JSON error (signaling/app.py), an `error` event on the data channel
(agent/realtime/events.py) or a media-stream message (agent/telephony/media_stream.py).
"""

from __future__ import annotations

from typing import Any


class AgentError(Exception):
    """A coded refusal: `code` for machines, `message` for people, `status` as HTTP would say
    it, `param` naming the offending field."""

    def __init__(self, code: str, message: str, *, status: int = 400, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.param = param
        self.headers = headers

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.param is not None:
            body["param"] = self.param
        return body


class CallError(AgentError):
    """A call could not be set up (bad offer, server full, ...)."""
