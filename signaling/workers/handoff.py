"""With several workers: a media-stream websocket accepted by a busier worker is handed, as
the connection itself, to a lighter one before the upgrade.

A new call over HTTP is re-posted to a lighter worker (routing.offer_to), but
a websocket lives as long as its call, and relaying it (relay.py) would cost the
accepting worker a hop per message for the whole call. Instead the accepting worker sends
the connection's file descriptor and the request's bytes to the lighter worker over a unix
datagram socket (SCM_RIGHTS); that worker serves the connection as if it had accepted it
(auth, limits and all), and the accepting worker lets go of it without a byte written. The
kernel keeps the connection open while the descriptor is in flight. A stream is handed only
after its credential passed on the accepting worker, and the receiving worker serves it
through the same guards as a connection it accepted: the per-address gate and the header
deadline. Only plain connections are handed (a TLS session's state cannot follow its
descriptor), a request is handed at most once, and a handoff that cannot be sent leaves the
stream where it is. (The access log of the handing worker shows such a request as 204; the
new worker's shows its 101.)
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct
import weakref
from pathlib import Path

from aiohttp import web

from signaling import slow_clients
from signaling.serving import SERVER_HOOK_KEY
from signaling.workers.load import WorkerLoads
from signaling.workers.routing import HANDOFF_KEY, LOADS_KEY, WORKERS_KEY, Handoff

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024  # a datagram; aiohttp's own header limits are well below
SOURCE = struct.Struct("<I")  # a handoff datagram starts with the handing worker's index
# How long a stream waits for room in the receiving worker's queue before it stays here.
SEND_WAIT_S = 0.5


def handoff_socket_path(folder: Path, index: int) -> Path:
    return folder / f"handoff-{index}.sock"


def request_bytes(request: web.Request) -> bytes:
    """The request line and headers as the client sent them."""
    version = request.version
    lines = [f"{request.method} {request.raw_path} HTTP/{version.major}.{version.minor}"
             .encode("latin-1")]
    lines += [name + b": " + value for name, value in request.raw_headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def can_hand_over(request: web.Request) -> bool:
    transport = request.transport
    return (transport is not None and not transport.is_closing()
            and transport.get_extra_info("sslcontext") is None
            and transport.get_extra_info("socket") is not None
            and not request.body_exists
            # bytes the caller sent early (before the upgrade's answer) were read here
            and not getattr(request.protocol, "_message_tail", b""))


async def hand_over(request: web.Request, index: int) -> bool:
    """Pass this connection to worker `index`; True when it took it (this worker must then
    write nothing more on it)."""
    if not can_hand_over(request):
        return False
    payload = SOURCE.pack(request.app[WORKERS_KEY].index) + request_bytes(request)
    if len(payload) > MAX_REQUEST_BYTES:
        return False
    transport = request.transport
    assert transport is not None
    path = handoff_socket_path(request.app[WORKERS_KEY].folder, index)
    loads = request.app[LOADS_KEY]
    loads.handed_over(index)  # before it can arrive there, so it is never counted negative
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        try:
            sender.connect(str(path))
            sent = await _send_when_room(sender, payload, transport)
        except OSError:  # not running
            sent = False
    if not sent:
        loads.lost_on_the_way(index)  # the stream stays here
        return False
    transport.abort()  # closes this worker's descriptor only: no shutdown, nothing sent
    log.debug("media stream from %s handed to worker %d", request.remote, index)
    return True


def _resolve_once(future: asyncio.Future[None]) -> None:
    """Resolve `future` unless it already is (a writer callback may fire more than once)."""
    if not future.done():
        future.set_result(None)


async def _send_when_room(sender: socket.socket, payload: bytes,
                          transport: asyncio.BaseTransport) -> bool:
    """Send the request and the connection's descriptor once the receiving worker's queue
    has room (a few datagrams by default: `net.unix.max_dgram_qlen`, 10); False if it has
    none for SEND_WAIT_S or the caller hung up meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SEND_WAIT_S
    while not transport.is_closing():
        connection = transport.get_extra_info("socket")
        try:
            sender.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", [connection.fileno()]))])
            return True
        except BlockingIOError:
            pass
        room = loop.create_future()
        # (a connected unix datagram socket is writable when its peer's queue has room)
        loop.add_writer(sender.fileno(), _resolve_once, room)
        try:
            await asyncio.wait_for(room, max(0.0, deadline - loop.time()))
        except asyncio.TimeoutError:
            return False
        finally:
            loop.remove_writer(sender.fileno())
    return False


class HandoffReceiver:
    """Takes connections handed to this worker and serves them with its own server. Each
    counts as on its way here (load.py) until its request reaches the routing
    middleware, which marks it received from the worker that handed it (`handed_from`)."""

    def __init__(self, path: Path, loads: WorkerLoads) -> None:
        self.path = path
        self._loads = loads
        self._socket: socket.socket | None = None
        self._server: web.Server | None = None
        self._adoptions: set[asyncio.Task[None]] = set()
        # the connections handed here, and by which worker: no client can claim to be one
        self._adopted: weakref.WeakKeyDictionary[asyncio.BaseTransport, int] = (
            weakref.WeakKeyDictionary())

    def handed_from(self, request: web.Request) -> int | None:
        """The worker that handed this request's connection here (None: not handed)."""
        return None if request.transport is None else self._adopted.get(request.transport)

    def start(self, server: web.Server) -> None:
        self._server = server
        self.path.unlink(missing_ok=True)  # a restarted worker's predecessor left it
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.setblocking(False)
        receiver.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._socket = receiver
        asyncio.get_running_loop().add_reader(receiver.fileno(), self._receive)

    def _receive(self) -> None:
        assert self._socket is not None
        while True:
            try:
                payload, descriptors, flags, _ = socket.recv_fds(
                    self._socket, MAX_REQUEST_BYTES, 1)
            except BlockingIOError:
                return
            except OSError:
                log.exception("worker handoff socket failed")
                return
            if (len(descriptors) != 1 or len(payload) < SOURCE.size
                    or flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC)):
                for descriptor in descriptors:  # not a handoff: nothing to serve
                    os.close(descriptor)
                continue
            connection = socket.socket(fileno=descriptors[0])
            (source,) = SOURCE.unpack_from(payload)
            task = asyncio.ensure_future(
                self._adopt(connection, source, payload[SOURCE.size:]))
            self._adoptions.add(task)
            task.add_done_callback(self._adoptions.discard)

    async def _adopt(self, connection: socket.socket, source: int, payload: bytes) -> None:
        assert self._server is not None
        connection.setblocking(False)
        try:
            # Served as if accepted here: the address gate and the header deadline included.
            transport, protocol = await asyncio.get_running_loop().connect_accepted_socket(
                slow_clients.guarded_factory(self._server), connection)
        except OSError:
            connection.close()  # the caller hung up meanwhile: it got here, and ended
            self._loads.received_from(source)
            return
        if transport.is_closing():  # refused by the address gate
            self._loads.received_from(source)
            return
        self._adopted[transport] = source
        # The request as the other worker read it; the caller waits for the upgrade's
        # answer, so nothing else of the connection has been read anywhere yet.
        protocol.data_received(payload)

    async def close(self) -> None:
        if self._socket is not None:
            asyncio.get_running_loop().remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None
            self.path.unlink(missing_ok=True)
        for task in list(self._adoptions):
            task.cancel()
        await asyncio.gather(*self._adoptions, return_exceptions=True)


def install(app: web.Application) -> None:
    group = app[WORKERS_KEY]
    receiver = HandoffReceiver(handoff_socket_path(group.folder, group.index), app[LOADS_KEY])
    app[SERVER_HOOK_KEY] = receiver.start
    app[HANDOFF_KEY] = Handoff(hand_over, receiver.handed_from)

    async def close(app: web.Application) -> None:
        await receiver.close()

    app.on_cleanup.append(close)
