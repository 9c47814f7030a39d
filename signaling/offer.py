"""`POST /offer`: the JSON offer/answer exchange of the aiortc examples."""

from __future__ import annotations

from aiohttp import web

from agent.media_agent import MediaAgent
from agent.plugins.base import SessionConfig
from signaling.auth import principal_of
from signaling.calls import RESOURCES_KEY, call_location
from signaling.errors import ApiError, read_json_object
from signaling.keys import AGENT_KEY


async def post_offer(request: web.Request) -> web.Response:
    agent: MediaAgent = request.app[AGENT_KEY]
    body = await read_json_object(request)
    if body.get("type") != "offer":
        raise ApiError("invalid_type", "'type' must be \"offer\"", param="type")
    if "sdp" not in body:
        raise ApiError("missing_sdp", "'sdp' is required", param="sdp")
    session = SessionConfig.from_json(body.get("session"))
    call, answer_sdp = await agent.create_call(body["sdp"], session)
    # A resource like any other call: GET, PATCH and DELETE /v1/realtime/calls/{call_id} reach
    # it, for the credential that made it.
    request.app[RESOURCES_KEY].add(call.id, principal_of(request))
    return web.json_response({"sdp": answer_sdp, "type": "answer", "call_id": call.id,
                              "location": call_location(call.id)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/offer", post_offer)
