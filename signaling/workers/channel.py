"""The private channel between workers: how one worker asks another, and how the other knows
the request came from a worker.

Two rules keep a client's bytes from ever being read as a worker's request:

- **Framing is the channel's own.** A forwarded request carries none of the client's framing
  (`Content-Length`, `Transfer-Encoding`, `Expect`, connection options); a body goes only
  with a method that has one (POST, PUT, PATCH), as the exact bytes the accepting worker
  read, with the length aiohttp's client writes for them. Every forwarded request gets a
  connection of its own (`force_close`): no answer left unread on a pooled connection can be
  handed to the next request.
- **Integrity.** The supervisor makes a secret at each start and hands it to its workers in
  the environment (never on a command line, never on disk). A forwarded request carries an
  HMAC-SHA256, under that secret, of the forwarding worker, a timestamp, the method, the raw
  path and query, the body's length and the client's address; a request counts as a
  worker's only when it arrives on the receiving worker's private unix socket and its MAC is
  right and fresh. A client, which never sees the secret, cannot make one.

The client's address travels with the request (`X-Agent-Worker-Client`, signed): on the
private unix socket the receiving worker would otherwise know no address, and its access log
and its own log lines (`sideband open from ...`) name the client as the accepting worker
would (`adopt_client_address`).

Why our own: the channel is two aiohttp endpoints in one trust domain; a signature over a
handful of fields is a few lines of the standard library (hmac), where an HTTP-signature or
mTLS library would bring key handling this per-start secret does not need.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from signaling.aiohttp_internals import set_remote
from signaling.workers.supervisor import CHANNEL_SECRET_ENV, worker_socket_path

SECRET_ENV = CHANNEL_SECRET_ENV
FORWARDED_HEADER = "X-Agent-Worker-Forwarded"
SIGNATURE_HEADER = "X-Agent-Worker-Signature"
CLIENT_HEADER = "X-Agent-Worker-Client"  # the client's address, as the forwarding worker saw it
MAX_AGE_S = 30.0  # a signature older (or newer) than this is refused
WORKER_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=2)
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Not passed on either way: the hop's own framing, what aiohttp sets for itself, and the
# channel's own marks (a client's copy of them is dropped, never relayed).
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade",
                         "proxy-connection", "te", "trailer", "content-encoding", "date",
                         "server", "content-length", "expect", "proxy-authorization",
                         FORWARDED_HEADER.lower(), SIGNATURE_HEADER.lower(),
                         CLIENT_HEADER.lower()})


@dataclass(frozen=True)
class Channel:
    """This worker's end of the channel: its index, its folder and the shared secret."""

    index: int
    folder: Path
    secret: bytes

    def socket_path(self, index: int) -> Path:
        return worker_socket_path(self.folder, index)

    def signature(self, forwarder: int, stamp: str, method: str, raw_path: str,
                  length: int, client: str = "") -> str:
        return mac_of(self.secret, str(forwarder), stamp, method, raw_path, str(length),
                      client)

    def sign(self, method: str, raw_path: str, length: int,
             client: str = "") -> dict[str, str]:
        """The headers that mark a request from this worker, for `client` (its address)."""
        stamp = f"{time.time():.3f}"
        mac = self.signature(self.index, stamp, method, raw_path, length, client)
        return {FORWARDED_HEADER: str(self.index), SIGNATURE_HEADER: f"t={stamp},mac={mac}",
                CLIENT_HEADER: client}

    def verify(self, request: web.Request) -> int | None:
        """The worker that forwarded `request`, if it really is one; None otherwise."""
        forwarder = request.headers.get(FORWARDED_HEADER, "")
        fields = dict(part.partition("=")[::2]
                      for part in request.headers.get(SIGNATURE_HEADER, "").split(","))
        stamp, mac = fields.get("t", ""), fields.get("mac", "")
        if not forwarder.isdigit() or not mac or not fresh(stamp):
            return None
        if request.transport is None or (request.transport.get_extra_info("sockname")
                                         != str(self.socket_path(self.index))):
            return None  # the mark counts only on this worker's private socket
        if "transfer-encoding" in request.headers:
            return None  # the channel never chunks: a body's length is signed
        expected = self.signature(int(forwarder), stamp, request.method, request.raw_path,
                                  request.content_length or 0,
                                  request.headers.get(CLIENT_HEADER, ""))
        return int(forwarder) if hmac.compare_digest(expected, mac) else None


def mac_of(secret: bytes, *fields: str) -> str:
    """HMAC-SHA256 under `secret` of the fields, one a line (also the cluster's signature
    between nodes: signaling/cluster/signing.py)."""
    text = "\n".join(fields).encode("utf-8", "surrogateescape")
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def fresh(stamp: str) -> bool:
    """A signature's timestamp within MAX_AGE_S of now."""
    try:
        return abs(time.time() - float(stamp)) <= MAX_AGE_S
    except ValueError:
        return False


CHANNEL_KEY = web.AppKey("worker_channel", Channel)
FORWARDER_KEY = "worker_forwarder"  # on a request: the worker that forwarded it


def from_a_worker(request: web.Request) -> bool:
    """Forwarded by another worker (checked once per request, then remembered)."""
    if FORWARDER_KEY not in request:
        channel = request.app.get(CHANNEL_KEY)
        request[FORWARDER_KEY] = None if channel is None else channel.verify(request)
    return request[FORWARDER_KEY] is not None


def client_address(text: str) -> str | None:
    """`text` as an IP address (None when it is not one)."""
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return None


def adopt_client_address(request: web.Request) -> None:
    """A request forwarded by another worker gets the client's address it carries as its
    own `request.remote` (on the private unix socket it has none): what the access log, which
    is handed this very request, and every log line of the handler name."""
    if not from_a_worker(request):
        return
    client = client_address(request.headers.get(CLIENT_HEADER, ""))
    if client is not None:
        # In place: a clone would not reach the access log, which logs the request it made.
        set_remote(request, client)


def forwarded_by(request: web.Request) -> int:
    """The worker that forwarded this request (-1: none)."""
    forwarder = request.get(FORWARDER_KEY)
    return -1 if forwarder is None else forwarder


def forwarded_headers(request: web.Request, length: int = 0) -> CIMultiDict[str]:
    """The client's end-to-end headers and this worker's signed mark, for a request of
    `length` body bytes."""
    headers = CIMultiDict((name, value) for name, value in request.headers.items()
                          if name.lower() not in HOP_HEADERS)
    headers.update(request.app[CHANNEL_KEY].sign(request.method, request.raw_path, length,
                                                 request.remote or ""))
    return headers


def carries_body(request: web.Request) -> bool:
    return request.method in BODY_METHODS


async def ask(request: web.Request, index: int, body: bytes | None = None
              ) -> tuple[int, CIMultiDict[str], bytes]:
    """Send `request` (with `body`, the bytes read from the client, where its method has one)
    to worker `index` on a connection of its own; its status, headers and body."""
    channel = request.app[CHANNEL_KEY]
    data = body if carries_body(request) and body else None
    connector = aiohttp.UnixConnector(path=str(channel.socket_path(index)), force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=WORKER_TIMEOUT,
                                     auto_decompress=False) as session:
        async with session.request(
            request.method, URL("http://worker" + request.raw_path, encoded=True),
            headers=forwarded_headers(request, len(data or b"")), data=data,
            allow_redirects=False, skip_auto_headers=("Content-Type",),
        ) as response:
            headers = CIMultiDict((name, value) for name, value in response.headers.items()
                                  if name.lower() not in HOP_HEADERS)
            return response.status, headers, await response.read()


def response_from(answer: tuple[int, CIMultiDict[str], bytes]) -> web.Response:
    status, headers, payload = answer
    return web.Response(status=status, headers=headers, body=payload)


def install(app: web.Application, channel: Channel) -> None:
    app[CHANNEL_KEY] = channel


__all__ = ["Channel", "CHANNEL_KEY", "CLIENT_HEADER", "FORWARDED_HEADER", "SIGNATURE_HEADER",
           "SECRET_ENV", "adopt_client_address", "ask", "carries_body", "client_address",
           "forwarded_by", "forwarded_headers", "fresh", "from_a_worker", "install", "mac_of",
           "response_from"]
