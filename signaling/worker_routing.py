"""With several workers (`--workers`): each request reaches the worker that owns what it names.

Any worker may accept a connection. A request about a call or RTP leg goes to the worker
whose tag its id carries (agent/worker_tag.py), and a request made with an ephemeral secret
(a new call, the page's /v1/models) goes to the worker that minted the secret;
the owner handles it as if it had accepted it, auth included, and its answer is relayed
unchanged. A new call goes to the least loaded worker: one over HTTP is re-posted there, a
media-stream websocket is handed there as the connection itself (worker_handoff.py). Views
of the whole server — `/health`, `/metrics`, `/metrics/calls` — ask every worker and add up
what they say; `POST /admin/drain` drains every worker. Workers talk over
the unix sockets in the worker folder; a request that arrives that way is marked and always
handled where it lands (the mark counts only on that socket).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from agent.errors import AgentError
from agent.media_agent import ON_PLACED
from agent.worker_tag import ID_TOKEN_CHARS, worker_of

from .auth import SECRET_PREFIX, SECRET_TOKEN_CHARS
from .cors import with_cors_headers
from .errors import ApiError, error_response
from .keys import AGENT_KEY
from .realtime import CALLS_PATH
from .supervisor import worker_socket_path
from .telephony import RTP_PATH, TELEPHONY_KEY
from .worker_load import WorkerLoads
from .worker_views import merge_calls, merge_health, merge_metrics

FORWARDED_HEADER = "X-Agent-Worker-Forwarded"
WORKER_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=2)
# Not relayed either way: the hop's own framing, and what aiohttp sets for itself.
HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "upgrade",
                         "proxy-connection", "te", "trailer", "content-encoding", "date",
                         "server"})
OWNED_PATHS = (re.compile(rf"^{CALLS_PATH}/([^/]+)(?:/hangup)?$"),
               re.compile(rf"^{RTP_PATH}/([^/]+)$"))
NEW_CALL_PATHS = frozenset({CALLS_PATH, "/offer"})
LOAD_REFRESH_S = 0.5


@dataclass(frozen=True)
class Handoff:
    """Set where connections can be handed to another worker (worker_handoff.py)."""

    # hands this request's connection to worker N; False where it could not
    hand_over: Callable[[web.Request, int], Awaitable[bool]]
    # the worker that handed this request's connection here (None: not handed)
    handed_from: Callable[[web.Request], int | None]


HANDOFF_KEY = web.AppKey("worker_handoff", Handoff)


@dataclass(frozen=True)
class WorkerGroup:
    index: int
    count: int
    folder: Path

    def socket_path(self, index: int) -> Path:
        return worker_socket_path(self.folder, index)

    def others(self) -> list[int]:
        """The other workers, in turn from the one after this one."""
        return [(self.index + step) % self.count for step in range(1, self.count)]


WORKERS_KEY = web.AppKey("workers", WorkerGroup)
SESSIONS_KEY = web.AppKey("worker_sessions", dict)
LOADS_KEY = web.AppKey("worker_loads", WorkerLoads)


def owner_of(request: web.Request) -> int | None:
    """The worker a request belongs to, where it names one."""
    for pattern in OWNED_PATHS:
        match = pattern.match(request.path)
        if match:
            return worker_of(match.group(1), ID_TOKEN_CHARS)
    # Only the worker that minted an ephemeral secret knows it: whatever a page does with it
    # (new calls, /v1/models, /v1/realtime/config) goes there.
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() == "bearer" and token.startswith(SECRET_PREFIX):
        return worker_of(token, SECRET_TOKEN_CHARS)
    return None


def _session(app: web.Application, index: int) -> aiohttp.ClientSession:
    sessions: dict[int, aiohttp.ClientSession] = app[SESSIONS_KEY]
    session = sessions.get(index)
    if session is None or session.closed:
        connector = aiohttp.UnixConnector(path=str(app[WORKERS_KEY].socket_path(index)))
        session = aiohttp.ClientSession(connector=connector, timeout=WORKER_TIMEOUT,
                                        auto_decompress=False)
        sessions[index] = session
    return session


def from_a_worker(request: web.Request) -> bool:
    """Forwarded by another worker: marked so, over this worker's private unix socket. The
    mark on a request from outside (the public port, a handed connection) means nothing."""
    if not request.headers.get(FORWARDED_HEADER) or request.transport is None:
        return False
    own_socket = str(request.app[WORKERS_KEY].socket_path(request.app[WORKERS_KEY].index))
    return request.transport.get_extra_info("sockname") == own_socket


def forwarded_by(request: web.Request) -> int:
    """The worker that forwarded this request (-1: not said)."""
    value = request.headers.get(FORWARDED_HEADER, "")
    return int(value) if value.isdigit() else -1


def forwarded_headers(request: web.Request) -> CIMultiDict[str]:
    headers = CIMultiDict((name, value) for name, value in request.headers.items()
                          if name.lower() not in HOP_HEADERS)
    headers[FORWARDED_HEADER] = str(request.app[WORKERS_KEY].index)  # who forwards it
    return headers


async def ask(request: web.Request, index: int, body: Any = None
              ) -> tuple[int, CIMultiDict[str], bytes]:
    """Send `request` (or its `body`) to worker `index`; its status, headers and body."""
    async with _session(request.app, index).request(
        request.method, f"http://worker{request.path_qs}", headers=forwarded_headers(request),
        data=body, allow_redirects=False,
    ) as response:
        headers = CIMultiDict((name, value) for name, value in response.headers.items()
                              if name.lower() not in HOP_HEADERS | {"content-length"})
        return response.status, headers, await response.read()


async def forward(request: web.Request, owner: int) -> web.Response:
    body = request.content.iter_chunked(64 * 1024) if request.body_exists else None
    try:
        status, headers, payload = await ask(request, owner, body)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        # The owner is gone (killed, restarting): so is everything it held.
        raise ApiError("call_not_found", "no such call (its worker is not running)",
                       param="call_id", status=404) from None
    return web.Response(status=status, headers=headers, body=payload)


def is_media_stream(request: web.Request) -> bool:
    """A new media-stream websocket (an upgrade to the telephony stream path)."""
    config = request.app.get(TELEPHONY_KEY)
    if config is None or request.method != "GET":
        return False
    path = config.media_stream_path
    return ((request.path == path or request.path.startswith(path + "/"))
            and "websocket" in request.headers.get("Upgrade", "").lower())


def lighter_than_here(request: web.Request) -> int | None:
    """A worker holding `MARGIN` fewer calls than this one, with this one's count fresh."""
    loads = request.app[LOADS_KEY]
    loads.publish()
    return loads.lighter_worker()


async def hand_to_lighter(request: web.Request) -> bool:
    """A media stream landed on a worker holding `MARGIN` more calls than another: hand its
    connection there (True: it is gone from here)."""
    handoff = request.app.get(HANDOFF_KEY)
    if handoff is None:
        return False
    source = handoff.handed_from(request)
    if source is not None:
        request.app[LOADS_KEY].received_from(source)  # counted here from now on
        return False  # handed at most once
    lighter = lighter_than_here(request)
    return lighter is not None and await handoff.hand_over(request, lighter)


def is_new_leg(request: web.Request) -> bool:
    return request.method == "POST" and (request.path in NEW_CALL_PATHS
                                         or request.path == RTP_PATH)


async def offer_to(request: web.Request, index: int, body: bytes) -> web.Response | None:
    """A new call re-posted to worker `index`: its answer, or None where it is full or does
    not answer (it died). Counted against that worker from now until it has received it."""
    loads = request.app[LOADS_KEY]
    loads.handed_over(index)
    try:
        status, headers, payload = await ask(request, index, body)
    except aiohttp.ClientConnectorError:
        loads.lost_on_the_way(index)  # it never got there (not running, restarting)
        return None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        return None  # it got there, or died with it (a restarted worker starts its count anew)
    if status == 503 and b'"server_full"' in payload:
        return None
    return web.Response(status=status, headers=headers, body=payload)


async def place_elsewhere(request: web.Request) -> web.Response:
    """This worker is full: offer the new call to the others in turn, so the server refuses
    only when every worker is (admission counts all workers, not one's share)."""
    body = await request.read()
    for index in request.app[WORKERS_KEY].others():
        answer = await offer_to(request, index, body)
        if answer is not None:
            return answer
    request.app[AGENT_KEY].check_capacity()  # everyone is full: the coded 503 from here
    # A slot freed here meanwhile: the body is read, so the caller retries (rare).
    raise ApiError("server_full", "every worker was full a moment ago; retry", status=503)


async def count_until_placed(request: web.Request,
                             handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                             ) -> web.StreamResponse:
    """A new call set up here counts as arriving until it holds a slot (the agent says so:
    `ON_PLACED`) or the handler is done, so the calls of a burst, all read before any is
    admitted, see each other. (A media stream's handler runs the whole call.)"""
    loads = request.app[LOADS_KEY]
    loads.arriving += 1
    loads.publish()
    arriving = True

    def placed() -> None:
        nonlocal arriving
        if arriving:
            arriving = False
            loads.arriving -= 1  # held from now on (the same count), or placed elsewhere

    token = ON_PLACED.set(placed)
    try:
        return await handler(request)
    finally:
        ON_PLACED.reset(token)
        placed()  # never placed (refused, gone): no longer counted at all
        loads.publish()


async def ask_all(request: web.Request) -> list[tuple[int, int | None, bytes]]:
    """(worker, status or None if unreachable, body) from every worker, this one included."""
    group = request.app[WORKERS_KEY]

    async def one(index: int) -> tuple[int, int | None, bytes]:
        try:
            status, _, body = await ask(request, index)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return index, None, b""
        return index, status, body

    return list(await asyncio.gather(*(one(i) for i in range(group.count))))


View = Callable[[list[tuple[int, int | None, bytes]]], web.Response]
VIEWS: dict[str, View] = {"/health": merge_health, "/metrics": merge_metrics,
                          "/metrics/calls": merge_calls}


@web.middleware
async def worker_routing_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if from_a_worker(request):
        if not is_new_leg(request):
            return await handler(request)
        # A call handed here: counted by the worker that handed it until it is received,
        # and here from then on.
        request.app[LOADS_KEY].received_from(forwarded_by(request))
        return await count_until_placed(request, handler)
    group = request.app[WORKERS_KEY]
    view = VIEWS.get(request.path)
    if view is not None and request.method == "GET":
        answers = await ask_all(request)
        # A refusal (auth, a route switched off) is every worker's: pass this one's on.
        own_status = next(status for index, status, _ in answers if index == group.index)
        if own_status != 200:
            return await handler(request)
        # Built here, outside the CORS middleware: the whole server's answer gets its
        # headers as each worker's own would.
        return with_cors_headers(request, view(answers))
    if request.path == "/admin/drain" and request.method == "POST":
        await asyncio.gather(*(ask(request, i) for i in group.others()),
                             return_exceptions=True)
        return await handler(request)
    if is_media_stream(request):
        if await hand_to_lighter(request):
            # aiohttp finds the transport closed and writes nothing of this
            return web.Response(status=204)
        return await count_until_placed(request, handler)
    owner = owner_of(request)
    try:
        if owner is None and is_new_leg(request):
            if not request.app[AGENT_KEY].has_room:
                return await place_elsewhere(request)
            # Handed to a lighter worker; None: it filled up meanwhile or did not answer, so
            # the call stays here.
            lighter = lighter_than_here(request)
            placed = (None if lighter is None
                      else await offer_to(request, lighter, await request.read()))
            return placed if placed is not None else await count_until_placed(request, handler)
        if owner is None or owner == group.index or owner >= group.count:
            return await handler(request)
        return await forward(request, owner)
    except AgentError as exc:  # this middleware sits outside the error middleware (and CORS,
        return error_response(exc)  # so a relayed answer does not get CORS headers twice)


async def _close_sessions(app: web.Application) -> None:
    for session in list(app[SESSIONS_KEY].values()):
        await session.close()
    app[LOADS_KEY].close()


async def _publish_load(app: web.Application) -> None:
    """Refresh this worker's count as calls end (no request here says so)."""
    while True:
        app[LOADS_KEY].publish()
        await asyncio.sleep(LOAD_REFRESH_S)


async def _load_publisher(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.ensure_future(_publish_load(app))
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def install(app: web.Application, group: WorkerGroup) -> None:
    """Route by owner before CORS, auth and limits, which the owner applies (outside the
    CORS middleware, so a relayed answer carries the owner's CORS headers only)."""
    app[WORKERS_KEY] = group
    app[SESSIONS_KEY] = {}
    app[LOADS_KEY] = WorkerLoads(group.folder, group.index, group.count,
                                 held=lambda: app[AGENT_KEY].legs.held_slots)
    app.middlewares.insert(0, worker_routing_middleware)
    app.cleanup_ctx.append(_load_publisher)
    app.on_cleanup.append(_close_sessions)
