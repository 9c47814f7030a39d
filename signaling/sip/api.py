"""The application's answer to `realtime.call.incoming`: accept or reject a ringing SIP call.

With `--sip-webhook`, an INVITE rings (180) while the webhook tells the application about it;
the application then calls, with the key that owns the call (inbound_owner.py:
`--sip-inbound-key`, or the trunk's `inbound_key`; an `--admin-key` too; with neither set any
key of the server; never an ephemeral secret, which only manages the call it created):

- `POST /v1/realtime/calls/{call_id}/accept` with a Realtime session object (`instructions`,
  `voice` or `audio.output.voice`, `extra_body`; an empty body: the server's defaults): the
  call is answered 200 with the SDP answer and its media start. The accepting key owns the
  call from then on (`/hangup`, `/dtmf`, `DELETE` with the same key).
- `POST /v1/realtime/calls/{call_id}/reject` with `{"status_code": 486}` (400-699; default
  603): that final response goes to the caller.

An unknown (or ended) call, or another key's, is 404 `call_not_found`; one already accepted,
rejected or answered is 409 `call_not_pending`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent.realtime.session_config import session_config_from_realtime
from signaling.auth import Principal, principal_of
from signaling.call_route import CallRoute
from signaling.calls import CALLS_PATH
from signaling.errors import ApiError, read_json_object
from signaling.sip.inbound_owner import leg_owner, may_handle
from signaling.sip.ua import SipCall, UserAgent

DEFAULT_REJECT_STATUS = 603
# The routes that name a call (the owning worker and node answer them: owned_routes.py).
ACCEPT = CallRoute(CALLS_PATH + "/{call_id}/accept")
REJECT = CallRoute(CALLS_PATH + "/{call_id}/reject")
CALL_ROUTES = (ACCEPT, REJECT)


def install_routes(app: web.Application,
                   ua_of: Callable[[web.Application], UserAgent | None]) -> None:
    """`ua_of(app)`: the running user agent, or None."""

    def pending_call(request: web.Request) -> tuple[UserAgent, SipCall, Principal]:
        principal = principal_of(request)
        ua = ua_of(request.app)
        call = ua.find_call(request.match_info["call_id"]) if ua is not None else None
        if ua is None or call is None or not may_handle(principal, call, ua.config):
            raise ApiError("call_not_found", "no such incoming call", param="call_id",
                           status=404)
        if not call.pending:
            raise ApiError("call_not_pending", "this call was already accepted, rejected or "
                           "answered", param="call_id", status=409)
        return ua, call, principal

    async def accept(request: web.Request) -> web.Response:
        pending_call(request)  # 404/409 before the body is looked at
        session = session_config_from_realtime(await optional_json(request), param="session")
        ua, call, principal = pending_call(request)
        await ua.accept(call, session, leg_owner(principal, call, ua.config))
        return web.json_response({"id": call.api_id, "object": "realtime.call",
                                  "status": "accepted"})

    async def reject(request: web.Request) -> web.Response:
        pending_call(request)
        body = await optional_json(request) or {}
        status = body.get("status_code", DEFAULT_REJECT_STATUS)
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 699:
            raise ApiError("invalid_value", "'status_code' must be a SIP final status from 400 "
                           "to 699", param="status_code")
        ua, call, _ = pending_call(request)
        ua.reject(call, status)
        return web.json_response({"id": call.api_id, "object": "realtime.call",
                                  "status": "rejected", "status_code": status})

    ACCEPT.add(app.router, "POST", accept)
    REJECT.add(app.router, "POST", reject)


async def optional_json(request: web.Request) -> dict[str, Any] | None:
    """The JSON object body, or None for an empty one."""
    if not request.can_read_body:
        return None
    return await read_json_object(request)
