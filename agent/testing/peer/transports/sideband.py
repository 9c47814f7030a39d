"""The agent's sideband websocket, `GET /v1/realtime?call_id=ID`, as the peer reads it.

Transports whose protocol has no room for Realtime events (rtp, sip, media-stream) get the
call's server events from here: each JSON message becomes an event on the call's timeline,
and `send` carries client events (`session.update`, ...) the other way. With `--sideband`
(`PeerOptions.sideband`) it is required: a call whose sideband cannot be opened fails with
`sideband_unavailable`. Without it the peer tries it once and goes on without events where
the server does not offer it (an agent without the route, another implementation).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlparse, urlunparse

import aiohttp

from agent.testing.peer.transports.base import CLOSED, UNSUPPORTED, PeerError

if TYPE_CHECKING:
    from agent.testing.peer.transports.base import PeerCall

SIDEBAND_PATH = "/v1/realtime"
SIDEBAND_UNAVAILABLE = "sideband_unavailable"


def sideband_url(base: str, call_id: str) -> str:
    parsed = urlparse(base)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parsed.scheme, "ws")
    return urlunparse((scheme, parsed.netloc, SIDEBAND_PATH, "", urlencode({"call_id": call_id}),
                       ""))


class Sideband:
    def __init__(self, call: PeerCall, http: aiohttp.ClientSession,
                 socket: aiohttp.ClientWebSocketResponse) -> None:
        self.call = call
        self._http = http
        self._socket = socket
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open_if(cls, call: PeerCall, headers: dict[str, str],
                      base_url: str | None = None) -> Sideband | None:
        """The call's sideband: required with `options.sideband`, tried otherwise."""
        required = call.options.sideband
        if call.call_id is None or not base_url:
            if required:
                raise PeerError(UNSUPPORTED, f"the {call.transport} transport does not learn "
                                "the agent's call id, so it has no sideband")
            return None
        url = sideband_url(base_url, call.call_id)
        http = call.http()
        try:
            socket = await asyncio.wait_for(http.ws_connect(url, headers=headers),
                                            call.options.timeout)
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError) as exc:
            await http.close()
            if required:
                status = getattr(exc, "status", None)
                why = f"HTTP {status}" if status else (str(exc) or type(exc).__name__)
                raise PeerError(SIDEBAND_UNAVAILABLE, f"{url}: {why}") from None
            return None
        return cls(call, http, socket)

    async def _read(self) -> None:
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                event = json.loads(message.data)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.call.add_event(event)

    async def send(self, event: dict[str, Any]) -> None:
        if self._socket.closed:
            raise PeerError(CLOSED, "the sideband is closed")
        await self._socket.send_str(json.dumps(event))

    async def close(self) -> None:
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self._socket.close()
        await self._http.close()
