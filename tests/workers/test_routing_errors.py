"""signaling/workers/routing.py: the routing middleware's own refusals."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from signaling import cors
from signaling.workers import routing


async def test_a_body_over_the_limit_read_for_routing_is_a_413(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A body read to forward it to another worker raises aiohttp's 413 exception, which
    # carries no max_size: the limit named is the request's own.
    async def too_large(request: web.Request, handler: object) -> web.StreamResponse:
        raise web.HTTPRequestEntityTooLarge(max_size=1024, actual_size=2048)

    async def not_reached(request: web.Request) -> web.StreamResponse:
        raise AssertionError("routing refuses before any handler")

    monkeypatch.setattr(routing, "route", too_large)
    app = web.Application()
    cors.setup(app, (), open_server=True)
    request = make_mocked_request("POST", "/v1/realtime/calls", app=app, client_max_size=1024)
    response = await routing.worker_routing_middleware(request, not_reached)
    assert isinstance(response, web.Response) and response.body is not None
    assert response.status == 413
    assert json.loads(bytes(response.body))["error"] == {
        "code": "body_too_large", "message": "request bodies are limited to 1024 bytes"}
