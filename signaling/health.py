"""`GET /health` (numbers for people), `/health/live` and `/health/ready` (Kubernetes probes)."""

from __future__ import annotations

import os

from aiohttp import web

from signaling.auth import principal_of
from signaling.call_limit import pending_calls
from signaling.calls import RESOURCES_KEY
from signaling.ice import rtc_network
from signaling.keys import AGENT_KEY
from signaling.sip.service import sip_health


async def get_health(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    body = {"status": "ok", "pid": os.getpid(), **agent.health(),
            "pending_calls": len(pending_calls(request.app)),  # ringing outbound SIP calls
            "rtc": rtc_network(agent.settings)}
    sip = sip_health(request.app)  # with --sip-listen: live transactions, dialogs, legs
    if sip is not None:
        body["sip"] = sip
    return web.json_response(body)


async def get_live(request: web.Request) -> web.Response:
    # Liveness: the event loop answers. Nothing else, so a busy or draining server is not
    # restarted by the orchestrator.
    return web.json_response({"status": "ok"})


async def get_ready(request: web.Request) -> web.Response:
    """200 while new calls would be admitted; 503 with the reasons otherwise."""
    agent = request.app[AGENT_KEY]
    reasons = []
    if agent.draining:
        reasons.append("draining")
    if not agent.started:
        reasons.append("plugin_not_loaded")
    capacity = agent.capacity
    if capacity and len(agent.legs) >= capacity:
        reasons.append("full")
    if reasons:
        return web.json_response({"status": "not_ready", "reasons": reasons}, status=503)
    return web.json_response({"status": "ready"})


async def get_calls(request: web.Request) -> web.Response:
    """The caller's own calls and legs (an operator key: everyone's)."""
    agent = request.app[AGENT_KEY]
    resources, principal = request.app[RESOURCES_KEY], principal_of(request)
    calls = [leg.stats() for leg in agent.legs if resources.visible_to(principal, leg.id)]
    return web.json_response({"calls": calls})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", get_health)
    app.router.add_get("/health/live", get_live)
    app.router.add_get("/health/ready", get_ready)
    app.router.add_get("/metrics/calls", get_calls)
