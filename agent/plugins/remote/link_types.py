"""What a link to a remote engine is configured with, asked for, and fails with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.logs.redact import redact_text
from agent.plugins.base import PluginError

PoolEffect = Literal["failed", "full", "warming"] | None
Payload = str | bytes
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class UpstreamError(PluginError):
    """A remote engine problem. `pool_effect` says what it means for that server's health."""

    def __init__(self, code: str, message: str, *, status: int = 502,
                 pool_effect: PoolEffect = None) -> None:
        # Messages embed exception text (aiohttp puts the URL in it): it reaches clients,
        # logs and /health, so credentials are masked here, once for every path.
        super().__init__(code, redact_text(message), status=status)
        self.pool_effect = pool_effect


def protocol_error(message: str) -> UpstreamError:
    return UpstreamError("upstream_protocol_error", f"the model server broke protocol: {message}")


@dataclass(frozen=True)
class LinkSettings:
    connect_timeout: float = 5.0  # TCP connect and the websocket upgrade's answer
    handshake_timeout: float = 20.0  # a Moshi server prefills its prompt before answering
    stall_timeout: float = 5.0  # no message from the engine this long while sending → error
    close_timeout: float = 2.0
    max_output_seconds: float = 2.0  # received audio not yet played; older frames dropped
    max_queued_input_frames: int = 25  # input waiting for the socket; oldest dropped


@dataclass(frozen=True)
class LinkRequest:
    """What the engine is asked for when the session opens."""

    voice: str | None = None
    instructions: str | None = None
    model: str | None = None


@dataclass
class Outgoing:
    """Input on its way to the engine."""

    payload: Payload
    frames: int  # input frames this payload completes (an encoder may hold some back)
    queued_at: float
