"""With several workers: a media-stream websocket that lands on a full worker is carried to
one with room.

A new call over HTTP is simply re-posted to another worker (routing.place_elsewhere);
a websocket cannot be handed over, so the accepting worker opens the same websocket on the
next worker with room (over its private unix socket) and relays every message both ways
until either side closes, passing the close code on. Only a full worker relays, and only
after the caller's credential passed here (API keys are the same on every worker).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import WSMsgType, web
from yarl import URL

from signaling.errors import ApiError
from signaling.telephony import OVERFLOW_KEY
from signaling.workers.channel import forwarded_headers, from_a_worker
from signaling.workers.routing import WORKERS_KEY

log = logging.getLogger(__name__)

# No total: the socket lives as long as the call. Connecting to a local socket is quick.
RELAY_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=2, connect=10)
FULL = 503


async def relay_media_stream(request: web.Request, max_msg_size: int
                             ) -> web.WebSocketResponse | None:
    """Carry this websocket to another worker with room; None when every one is full."""
    if from_a_worker(request):
        return None  # already relayed here by a full worker: never pass it round again
    group = request.app[WORKERS_KEY]
    for index in group.others():
        connector = aiohttp.UnixConnector(path=str(group.socket_path(index)))
        session = aiohttp.ClientSession(connector=connector, timeout=RELAY_TIMEOUT)
        try:
            upstream = await session.ws_connect(
                URL("http://worker" + request.raw_path, encoded=True),
                headers=_upgrade_headers(request),
                max_msg_size=max_msg_size, autoping=True)
        except aiohttp.WSServerHandshakeError as exc:
            await session.close()
            if exc.status == FULL:
                continue
            # It took the credential here, not there: the workers disagree.
            raise ApiError("worker_relay_failed", f"the worker with room refused the stream "
                           f"({exc.status})", status=502) from exc
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            await session.close()
            continue
        log.info("media stream from %s relayed to another worker (this one is full)",
                 request.remote)
        try:
            return await relay_both_ways(request, upstream, max_msg_size)
        finally:
            await upstream.close()
            await session.close()
    return None


async def relay_to_owner(request: web.Request, index: int, max_msg_size: int
                         ) -> web.WebSocketResponse:
    """Carry a websocket about something worker `index` holds (a call's sideband) there and
    relay it until either side closes. ApiError before the upgrade: the owner refused it
    (its 404 stays a 404) or is not running (the call went with it)."""
    connector = aiohttp.UnixConnector(path=str(request.app[WORKERS_KEY].socket_path(index)))
    session = aiohttp.ClientSession(connector=connector, timeout=RELAY_TIMEOUT)
    try:
        upstream = await session.ws_connect(
            URL("http://worker" + request.raw_path, encoded=True),
            headers=_upgrade_headers(request), max_msg_size=max_msg_size, autoping=True)
    except aiohttp.WSServerHandshakeError as exc:
        await session.close()
        if exc.status == 404:
            raise ApiError("call_not_found", "no such call", param="call_id",
                           status=404) from None
        raise ApiError("worker_relay_failed", f"the worker holding the call refused the "
                       f"websocket ({exc.status})", status=502) from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        await session.close()
        raise ApiError("call_not_found", "no such call (its worker is not running)",
                       param="call_id", status=404) from None
    try:
        return await relay_both_ways(request, upstream, max_msg_size)
    finally:
        await upstream.close()
        await session.close()


def _upgrade_headers(request: web.Request) -> dict[str, str]:
    # The client's own handshake keys belong to its socket with this worker.
    return {name: value for name, value in forwarded_headers(request).items()
            if not name.lower().startswith("sec-websocket")}


async def relay_both_ways(request: web.Request, upstream: aiohttp.ClientWebSocketResponse,
                 max_msg_size: int) -> web.WebSocketResponse:
    """The caller's websocket, accepted here and relayed to and from `upstream` until either
    side closes (also used between cluster nodes: signaling/cluster/sockets.py)."""
    caller = web.WebSocketResponse(max_msg_size=max_msg_size, compress=False)
    await caller.prepare(request)
    to_worker = asyncio.ensure_future(_pump(caller, upstream))
    to_caller = asyncio.ensure_future(_pump(upstream, caller))
    try:
        done, _ = await asyncio.wait({to_worker, to_caller}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (to_worker, to_caller):
            task.cancel()
        await asyncio.gather(to_worker, to_caller, return_exceptions=True)
    if to_caller in done and not to_caller.cancelled() and to_caller.exception() is None:
        code, reason = to_caller.result()  # the worker ended the stream: say why, as it did
        await caller.close(code=code, message=reason.encode("utf-8")[:120])
    return caller


async def _pump(source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
                sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse
                ) -> tuple[int, str]:
    """Copy messages until `source` closes; its close code and reason."""
    while True:
        message = await source.receive()
        if message.type == WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type == WSMsgType.BINARY:
            await sink.send_bytes(message.data)
        elif message.type == WSMsgType.CLOSE:
            return int(message.data or 1000), str(message.extra or "")
        elif message.type in (WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return source.close_code or 1000, ""


def install(app: web.Application) -> None:
    app[OVERFLOW_KEY] = relay_media_stream
