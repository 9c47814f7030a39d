"""With several workers (`--workers`): each request reaches the worker that owns what it names.

Any worker may accept a connection. A request about a call or RTP leg goes to the worker
whose tag its id carries (agent/worker_tag.py), and a request made with an ephemeral secret
(a new call, the page's /v1/models) goes to the worker that minted the secret;
the owner handles it as if it had accepted it, auth included, and its answer is relayed
unchanged. A new call goes to the least loaded worker: one over HTTP is re-posted there, a
media-stream websocket is handed there as the connection itself (handoff.py). Views
of the whole server — `/health`, `/metrics`, `/metrics/calls` — ask every worker and add up
what they say; `POST /admin/drain` drains every worker. Workers talk over
the unix sockets in the worker folder (channel.py: the channel's own framing, one
connection per request, and a signed mark that counts only on that socket); a request that
arrives that way is handled where it lands.

Nothing is forwarded, fanned out or placed before the credential is checked here (API keys
are the same on every worker; an ephemeral secret minted by another worker is checked by
that worker, the one it is forwarded to), and every body read here has the
`--body-timeout` deadline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from agent.errors import AgentError
from agent.media_agent import ON_PLACED
from agent.worker_tag import ID_TOKEN_CHARS, worker_of
from signaling import owned_routes
from signaling.address_limit import mark_authenticated
from signaling.auth import (
    AUTH_SETTINGS_KEY,
    SECRET_PREFIX,
    SECRET_TOKEN_CHARS,
    authenticate,
    bearer_token,
    is_public,
)
from signaling.calls import CALLS_PATH
from signaling.cors import with_cors_headers
from signaling.errors import ApiError, error_response, json_error
from signaling.keys import AGENT_KEY
from signaling.serving import ALL_SERVING_KEY, BEFORE_PUBLIC_KEY
from signaling.sip.outbound_api import SIP_CALLS_PATH
from signaling.slow_clients import read_body_in_time
from signaling.telephony import RTP_PATH, TELEPHONY_KEY, with_url_token
from signaling.workers import channel, limits
from signaling.workers.channel import (
    adopt_client_address,
    ask,
    carries_body,
    forwarded_by,
    from_a_worker,
    response_from,
)
from signaling.workers.load import WorkerLoads
from signaling.workers.supervisor import worker_socket_path
from signaling.workers.views import merge_calls, merge_health, merge_metrics

log = logging.getLogger(__name__)

OWNED_PATHS = owned_routes.PATHS  # a call's or leg's routes, as registered (group 1: its id)
SIP_WORKER = 0  # the one worker serving SIP (signaling/sip/service.py): it places SIP calls
NEW_CALL_PATHS = frozenset({CALLS_PATH, "/offer"})
LOAD_REFRESH_S = 0.5


@dataclass(frozen=True)
class Handoff:
    """Set where connections can be handed to another worker (handoff.py)."""

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
    secret: bytes = field(repr=False)  # the channel's (channel.py), per server start

    def socket_path(self, index: int) -> Path:
        return worker_socket_path(self.folder, index)

    def others(self) -> list[int]:
        """The other workers, in turn from the one after this one."""
        return [(self.index + step) % self.count for step in range(1, self.count)]


WORKERS_KEY = web.AppKey("workers", WorkerGroup)
LOADS_KEY = web.AppKey("worker_loads", WorkerLoads)


def owner_of(request: web.Request) -> int | None:
    """The worker a request belongs to, where it names one."""
    if request.path == SIP_CALLS_PATH:
        return SIP_WORKER
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


def check_credential(request: web.Request) -> None:
    """Refuse here (a coded 401/403) what the handling worker would refuse for want of a
    credential, before anything is forwarded, fanned out, placed or read (a media stream's
    URL token counts as its credential). An ephemeral secret another worker minted is left
    to that worker."""
    config = request.app.get(TELEPHONY_KEY)
    if config is not None:
        request = with_url_token(request, config.media_stream_path)
    if is_public(request) or request.app[AUTH_SETTINGS_KEY].open:
        return
    token = bearer_token(request)
    if (token is not None and token.startswith(SECRET_PREFIX)
            and worker_of(token, SECRET_TOKEN_CHARS) not in (None, request.app[WORKERS_KEY].index)):
        return  # checked where it was minted
    authenticate(request)
    mark_authenticated(request)


async def read_body(request: web.Request) -> bytes | None:
    """The body as the client sent it, where the method has one (within --body-timeout)."""
    return await read_body_in_time(request) if carries_body(request) else None


async def forward(request: web.Request, owner: int) -> web.Response:
    body = await read_body(request)
    try:
        return response_from(await ask(request, owner, body))
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
        # The owner is gone (killed, restarting): so is everything it held.
        raise ApiError("call_not_found", "no such call (its worker is not running)",
                       param="call_id", status=404) from None


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


async def offer_to(request: web.Request, index: int, body: bytes | None
                   ) -> web.Response | None:
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
    return response_from((status, headers, payload))


async def place_elsewhere(request: web.Request) -> web.Response:
    """This worker is full: offer the new call to the others in turn, so the server refuses
    only when every worker is (admission counts all workers, not one's share)."""
    agent = request.app[AGENT_KEY]
    if agent.draining or (agent.shared_capacity is not None and agent.shared_capacity.full()):
        agent.check_capacity()  # no other worker has room either: the coded 503 from here
    body = await read_body(request)
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
        adopt_client_address(request)
        if not is_new_leg(request):
            return await handler(request)
        # A call handed here: counted by the worker that handed it until it is received,
        # and here from then on.
        request.app[LOADS_KEY].received_from(forwarded_by(request))
        return await count_until_placed(request, handler)
    try:
        return await route(request, handler)
    except AgentError as exc:  # this middleware sits outside the error middleware (and CORS,
        # so a relayed answer does not get CORS headers twice): its refusals get them here
        refusal = with_cors_headers(request, error_response(exc))
        if exc.code == "body_timeout":
            refusal.force_close()  # the rest of the body is not worth waiting for
        return refusal
    except web.HTTPRequestEntityTooLarge:
        # (the exception keeps no max_size attribute: the limit it reports is the request's)
        return with_cors_headers(request, json_error(
            413, "body_too_large",
            f"request bodies are limited to {request.client_max_size} bytes"))


async def route(request: web.Request,
                handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    group = request.app[WORKERS_KEY]
    view = VIEWS.get(request.path)
    if view is not None and request.method == "GET":
        check_credential(request)
        answers = await ask_all(request)
        # A refusal (a route switched off) is every worker's: pass this one's on.
        own_status = next(status for index, status, _ in answers if index == group.index)
        if own_status != 200:
            return await handler(request)
        # Built here, outside the CORS middleware: the whole server's answer gets its
        # headers as each worker's own would.
        return with_cors_headers(request, view(answers))
    if request.path == "/admin/drain" and request.method == "POST":
        check_credential(request)
        response = await handler(request)  # who may drain is decided here, once
        if response.status == 202:
            await asyncio.gather(*(ask(request, i) for i in group.others()),
                                 return_exceptions=True)
        return response
    if is_media_stream(request):
        check_credential(request)
        if await hand_to_lighter(request):
            # aiohttp finds the transport closed and writes nothing of this
            return web.Response(status=204)
        return await count_until_placed(request, handler)
    owner = owner_of(request)
    if owner is None and is_new_leg(request):
        check_credential(request)
        if not request.app[AGENT_KEY].has_room:
            return await place_elsewhere(request)
        # Handed to a lighter worker; None: it filled up meanwhile or did not answer, so
        # the call stays here.
        lighter = lighter_than_here(request)
        placed = (None if lighter is None
                  else await offer_to(request, lighter, await read_body(request)))
        return placed if placed is not None else await count_until_placed(request, handler)
    if owner is None or owner == group.index or owner >= group.count:
        return await handler(request)
    check_credential(request)
    return await forward(request, owner)


async def _close_loads(app: web.Application) -> None:
    app[LOADS_KEY].close()


async def _publish_load(app: web.Application) -> None:
    """Refresh this worker's counts as calls end and secrets expire (no request says so)."""
    while True:
        app[LOADS_KEY].publish()
        limits.refresh(app)
        await asyncio.sleep(LOAD_REFRESH_S)


async def _load_publisher(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.ensure_future(_publish_load(app))
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# How long the first worker waits for the others before it serves the public sockets anyway
# (a worker that cannot start is the supervisor's to restart; calls must not wait on it).
OTHERS_READY_TIMEOUT = 60.0


async def wait_for_the_other_workers(group: WorkerGroup,
                                     timeout: float = OTHERS_READY_TIMEOUT) -> None:
    """Until every other worker answers on its private socket (the supervisor starts them
    once this one's answers). The first worker waits here before its public sockets: a call
    admitted while another worker still starts (imports, plugin, a full GC pass) shares the
    cores with that start-up; on a 2-core machine the first SIP call after start-up had gaps
    of up to 96 ms."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    waiting = [group.socket_path(index) for index in group.others()]
    while waiting and loop.time() < deadline:
        path = waiting[0]
        try:
            _, writer = await asyncio.open_unix_connection(str(path))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        waiting.pop(0)
    if waiting:
        log.warning("workers %s not serving after %.0f s: serving without them",
                    ", ".join(path.stem for path in waiting), timeout)


def install(app: web.Application, group: WorkerGroup) -> None:
    """Route by owner before CORS, auth and limits, which the owner applies (outside the
    CORS middleware, so a relayed answer carries the owner's CORS headers only)."""
    app[WORKERS_KEY] = group
    channel.install(app, channel.Channel(group.index, group.folder, group.secret))
    limits.install(app, group.folder, group.index, group.count)
    app[LOADS_KEY] = WorkerLoads(group.folder, group.index, group.count,
                                 held=lambda: app[AGENT_KEY].legs.held_slots)
    app.middlewares.insert(0, worker_routing_middleware)
    if group.index == 0 and group.count > 1:
        all_serving = app[ALL_SERVING_KEY] = asyncio.Event()

        async def before_public() -> None:
            try:
                await wait_for_the_other_workers(group)
            finally:
                all_serving.set()
        app[BEFORE_PUBLIC_KEY] = before_public
    app.cleanup_ctx.append(_load_publisher)
    app.on_cleanup.append(_close_loads)
