"""One HTTP client per event loop for the peer's short requests to the agent (an RTP leg's
create and delete, a realtime call's offer and hang-up, a WebRTC offer), held by the calls
that use it and closed when the last lets go.

A session of its own per request costs a connector, a TCP connection and its handshake on
both sides, and the agent an accept, for every request: in a load test of short RTP calls
the HTTP work (a create, a delete and the sideband's websocket) was about half of the peer's
set-up of a call under cProfile. Shared, the requests of all the calls of a loop go over
kept-alive connections. Websockets (the sideband, the media stream) keep a session of their
own: one lives as long as its call, and a session's total timeout, which bounds each short
request here, must not bound it.

A call takes the client with `hold` and gives it back with `release` (`PeerCall.requests`
and `PeerCall.begin_close` do both); sessions differ by certificate checking and request
timeout, which all the calls of a run share.
"""

from __future__ import annotations

import aiohttp

from agent.testing.peer.transports.per_loop import PerLoop

Key = tuple[bool, float]  # (verify TLS certificates, each request's timeout in seconds)


class HttpClients:
    def __init__(self) -> None:
        self._sessions: dict[Key, aiohttp.ClientSession] = {}
        self._holders: dict[Key, int] = {}

    def hold(self, verify_tls: bool, timeout: float) -> aiohttp.ClientSession:
        """The loop's session for these settings (made on first use), held until `release`."""
        key = (verify_tls, timeout)
        session = self._sessions.get(key)
        if session is None or session.closed:
            # limit=0: no cap on connections (calls of a large run may ask all at once).
            connector = aiohttp.TCPConnector(ssl=verify_tls, limit=0)
            session = self._sessions[key] = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=timeout))
            self._holders[key] = 0
        self._holders[key] += 1
        return session

    async def release(self, verify_tls: bool, timeout: float) -> None:
        """One holder fewer; the last one closes the session (and its connections)."""
        key = (verify_tls, timeout)
        if key not in self._holders:
            return
        self._holders[key] -= 1
        if self._holders[key] <= 0:
            del self._holders[key]
            session = self._sessions.pop(key)
            await session.close()

    def __len__(self) -> int:
        return len(self._sessions)


http_clients = PerLoop(HttpClients)  # the running loop's one
