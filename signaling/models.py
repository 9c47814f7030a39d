"""`GET /v1/models`: what this server serves, in the OpenAI list shape, with the voices."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from signaling.errors import json_error
from signaling.keys import AGENT_KEY

STARTED_AT_KEY = web.AppKey("started_at", int)


def model_entry(request: web.Request) -> dict[str, Any]:
    agent = request.app[AGENT_KEY]
    capabilities = agent.plugin.capabilities()
    return {
        "id": agent.plugin.id,
        "object": "model",
        "created": request.app[STARTED_AT_KEY],
        "owned_by": "duplex-agent",
        "plugin": agent.plugin.id,
        "voices": list(capabilities.voices),
        "voice_kinds": dict(capabilities.voice_kinds),
        "default_voice": capabilities.default_voice,
        "capabilities": capabilities.to_dict(),
    }


async def list_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [model_entry(request)]})


async def get_model(request: web.Request) -> web.Response:
    entry = model_entry(request)
    if request.match_info["model"] != entry["id"]:
        return json_error(404, "model_not_found", "no such model", param="model")
    return web.json_response(entry)


def add_routes(app: web.Application) -> None:
    app[STARTED_AT_KEY] = int(time.time())
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
