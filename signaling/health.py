"""`GET /health`: liveness plus the numbers an operator watches."""

from __future__ import annotations

from aiohttp import web

from .keys import AGENT_KEY


async def get_health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", **request.app[AGENT_KEY].health()})


async def get_calls(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    calls = [call.stats() for call in agent.calls.values()]
    # Telephony legs (media-stream websockets, RTP) hold call slots too.
    calls += [session.stats() for session in agent.sessions.values()]
    return web.json_response({"calls": calls})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", get_health)
    app.router.add_get("/metrics/calls", get_calls)
