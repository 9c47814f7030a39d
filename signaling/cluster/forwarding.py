"""One hop to the owning node: a request for another node's call, or a new call placed
there, sent to that node's `--node-address` over HTTP or HTTPS (checked against
`--cluster-ca`), signed for that node once (signing.py), and its answer relayed unchanged,
so the client never sees a redirect (browsers drop `Authorization` on a cross-origin one).
The receiving node routes it to its worker as a worker would. An address that answers 421
`node_misdirected` is not the node's (a stale table: another node took the address), and
counts as the node not answering.

Connections between nodes are pooled (the forward latency is the benchmark's number); each
answer is read whole before its connection goes back to the pool.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time

import aiohttp
from aiohttp import web
from aiohttp.streams import StreamReader
from multidict import CIMultiDict
from yarl import URL

from agent.errors import AgentError
from signaling.aiohttp_internals import refill_body
from signaling.cluster.signing import MISDIRECTED, NODE_HEADERS, NodeGate, NodeSigner
from signaling.workers.channel import HOP_HEADERS

log = logging.getLogger(__name__)

NODE_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=1)
NOT_RELAYED = HOP_HEADERS | NODE_HEADERS | {"host"}


class NodeUnreachable(AgentError):
    """The node did not take the request (gone, restarting, not listening)."""

    def __init__(self, message: str) -> None:
        super().__init__("node_unreachable", message, status=502)


class Forwarder:
    """This node's client to the others."""

    def __init__(self, signer: NodeSigner, gate: NodeGate | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.signer = signer
        self.gate = gate if gate is not None else NodeGate(signer)  # requests coming in
        self.tls: ssl.SSLContext | bool = tls if tls is not None else True  # https addresses
        self._session: aiohttp.ClientSession | None = None
        self.forwarded = 0
        self.latencies: list[float] = []  # seconds, kept for /metrics' histogram feed

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=NODE_TIMEOUT, auto_decompress=False,
                connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True,
                                               ssl=self.tls))
        return self._session

    async def send(self, request: web.Request, address: str, body: bytes, to: str,
                   placed: str = "") -> tuple[web.Response, float]:
        """`request` (with the `body` read from the client) sent to node `to` at `address`:
        its answer and how long the hop took. NodeUnreachable when it could not be sent."""
        headers = CIMultiDict((name, value) for name, value in request.headers.items()
                              if name.lower() not in NOT_RELAYED)
        started = time.perf_counter()
        for attempt in (1, 2):
            # signed for each attempt: a signature is good for one request
            headers.update(self.signer.sign(request.method, request.raw_path, body, to=to,
                                            placed=placed))
            try:
                async with self.session().request(
                    request.method, URL(address + request.raw_path, encoded=True),
                    headers=headers, data=body if body else None, allow_redirects=False,
                    skip_auto_headers=("Content-Type",),
                ) as response:
                    payload = await response.read()
                    answer = CIMultiDict((name, value)
                                         for name, value in response.headers.items()
                                         if name.lower() not in NOT_RELAYED)
                break
            except aiohttp.ClientConnectorCertificateError as exc:
                log.warning("node %s at %s: its certificate is not trusted (%s); check "
                            "--cluster-ca", to, address, exc.certificate_error)
                raise NodeUnreachable(str(exc)) from None
            except aiohttp.ServerDisconnectedError as exc:
                # A pooled connection the other node had closed while idle: the request
                # never reached it; once more on a new connection.
                if attempt == 2:
                    raise NodeUnreachable(str(exc)) from None
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                raise NodeUnreachable(str(exc) or type(exc).__name__) from None
        took = time.perf_counter() - started
        if response.status == MISDIRECTED and b"node_misdirected" in payload:
            raise NodeUnreachable(f"the node at {address} is not node {to}")
        self.forwarded += 1
        return web.Response(status=response.status, headers=answer, body=payload), took

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def with_body(request: web.Request, body: bytes) -> web.Request:
    """`request` after its body was read to check a node's signature: `read()` answers from
    aiohttp's copy, and the body stream is refilled with the same bytes for a handler that
    streams it (a multipart offer)."""
    stream = StreamReader(request.protocol, 2**16, loop=asyncio.get_running_loop())
    if body:
        stream.feed_data(body)
    stream.feed_eof()
    refill_body(request, stream)
    return request
