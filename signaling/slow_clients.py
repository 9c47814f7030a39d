"""Slow clients: bounded time to send request headers and request bodies.

A client that trickles its headers or body (one byte every couple of seconds) would
otherwise hold a connection, a task and a file descriptor for as long as it likes, before
it has authenticated. Two deadlines bound that:

- header timeout (`--header-timeout`, default 10 s): a new connection that has not sent one
  complete request head within it is closed. aiohttp's own keep-alive timer only applies
  after a first request, so the deadline is armed when the connection is accepted (see
  `guard_protocol_factory`); later requests on a kept-alive connection are bounded by
  aiohttp's keep-alive timeout.
- body timeout (`--body-timeout`, default 30 s): a request whose body has not fully
  arrived within it after its head gets 408 `body_timeout` and its connection is closed
  (`body_timeout_middleware`). Requests refused before their body is read (401, 415, ...)
  never wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from agent.errors import AgentError
from signaling.address_limit import gated_protocol_factory, new_gate
from signaling.aiohttp_internals import requests_parsed
from signaling.errors import json_error

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Stream servers only: every protocol here is an asyncio.Protocol (data_received and all).
ProtocolFactory = Callable[[], asyncio.Protocol]


class SlowClientStats:
    """Counters an operator (and the tests) can read."""

    def __init__(self) -> None:
        self.header_timeouts = 0
        self.body_timeouts = 0


STATS = SlowClientStats()


# -- header deadline --------------------------------------------------------------------------


def _close_if_no_request(handler: RequestHandler) -> None:
    # No request head parsed on this connection at the deadline: the head never completed.
    if handler.transport is None or requests_parsed(handler):
        return
    STATS.header_timeouts += 1
    peer = handler.transport.get_extra_info("peername")
    log.info("closing a connection from %s: no complete request head in time", peer)
    handler.force_close()


def guard_protocol_factory(factory: ProtocolFactory, header_timeout: float) -> ProtocolFactory:
    """Wrap aiohttp's protocol factory: each accepted connection gets a header deadline."""
    if header_timeout <= 0:
        return factory

    def make() -> asyncio.Protocol:
        protocol = factory()
        if isinstance(protocol, RequestHandler):
            # The factory runs when the connection is accepted, so the deadline starts now.
            # (The timer holds the handler until then: it has no __weakref__ slot.)
            asyncio.get_running_loop().call_later(header_timeout, _close_if_no_request, protocol)
        return protocol

    return make


def guarded_event_loop(header_timeout: float,
                       per_address: int = 0) -> asyncio.AbstractEventLoop:
    """A new event loop whose servers give every connection a header deadline, and refuse
    connections past `per_address` unauthenticated ones from one address (address_limit.py).

    `web.run_app` builds its server internally and takes only a loop, so the loop's
    `create_server` is the one place every accepted connection can be seen from. A
    connection another worker hands over (workers/handoff.py) gets the same guards through
    `guarded_factory`.
    """
    global guarded_factory
    loop = asyncio.new_event_loop()
    create_server = loop.create_server
    gate = new_gate(per_address)

    def guard(protocol_factory: ProtocolFactory) -> ProtocolFactory:
        return gated_protocol_factory(guard_protocol_factory(protocol_factory, header_timeout),
                                      gate)

    async def guarded_create_server(protocol_factory: ProtocolFactory, *args: Any,
                                    **kwargs: Any) -> asyncio.AbstractServer:
        return await create_server(guard(protocol_factory), *args, **kwargs)

    # create_server's overloads (typeshed) take no wrapper with a plain (*args, **kwargs).
    loop.create_server = guarded_create_server  # type: ignore[method-assign,assignment]
    guarded_factory = guard
    return loop


def _unguarded(protocol_factory: ProtocolFactory) -> ProtocolFactory:
    return protocol_factory


# The guards of this process's public servers, for connections accepted elsewhere.
guarded_factory: Callable[[ProtocolFactory], ProtocolFactory] = _unguarded


# -- body deadline ----------------------------------------------------------------------------


class BodyTimeout(AgentError):
    """Set on a request's payload stream when its body did not arrive in time."""

    def __init__(self) -> None:
        super().__init__("body_timeout", "the request body did not arrive in time", status=408)


BODY_TIMEOUT_KEY = web.AppKey("body_timeout", float)


@web.middleware
async def body_timeout_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    timeout = request.app[BODY_TIMEOUT_KEY]
    if timeout <= 0 or not request.body_exists or request.content.is_eof():
        return await handler(request)
    expired = False

    def expire() -> None:
        nonlocal expired
        if not request.content.is_eof():
            expired = True
            # Wakes any read in progress (json, multipart, read) with BodyTimeout.
            request.content.set_exception(BodyTimeout())

    timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        response = await handler(request)
    except Exception:
        if not expired:
            raise
    else:
        if not expired:
            return response
    finally:
        timer.cancel()
    STATS.body_timeouts += 1
    # Whatever the handler made of the broken read (often a 400), the cause is the client.
    refusal = json_error(408, "body_timeout",
                         f"the request body did not arrive within {timeout:g} s")
    refusal.force_close()  # the rest of the body is not worth waiting for
    return refusal


async def read_body_in_time(request: web.Request) -> bytes:
    """The whole body, read outside the body-timeout middleware (a request passed on to
    another worker is read before it), within the same deadline: BodyTimeout (408) past it."""
    timeout = request.app[BODY_TIMEOUT_KEY]
    try:
        return await asyncio.wait_for(request.read(), timeout if timeout > 0 else None)
    except asyncio.TimeoutError:
        STATS.body_timeouts += 1
        raise BodyTimeout() from None


def setup(app: web.Application, body_timeout: float) -> None:
    app[BODY_TIMEOUT_KEY] = body_timeout
