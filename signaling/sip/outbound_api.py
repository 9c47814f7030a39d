"""The HTTP face of outbound SIP calls and transfers (docs/sip.md, "Outbound calls" and
"Transfer").

- `POST /v1/sip/calls` `{"to": "sip:…", "from": "…", "trunk": NAME, "headers": {…},
  "session": {…}, "ring_timeout": S}` places a call: 201 with the call (`id`, `status`) and
  `Location: /v1/sip/calls/{id}`. The key that placed it owns it.
- `GET /v1/sip/calls/{id}`: its state (calling, ringing, answered, ended), ending `reason`,
  `sip_status` and events; `DELETE /v1/sip/calls/{id}` and `POST .../hangup` end it (CANCEL
  before the answer, BYE after). It is also a call of `/v1/realtime/calls/{id}` from the
  INVITE on (`SipCallDirectory`: GET with `transport`, `state`, `remote_party`,
  `sip_status`, `reason`; DELETE/hangup: CANCEL while it rings), and once its leg is open of
  the leg routes (DTMF, refer) and `/metrics/calls`, with the same id. Inbound SIP calls are
  there too, ringing (DELETE declines them, 603) or answered.
- `POST /v1/realtime/calls/{id}/refer` `{"target_uri": "tel:…" | "sip:…"}` transfers an
  established SIP call, inbound or outbound (refer.py): 202 once the far end accepted the
  REFER.

Another key's call is the same 404 as an unknown one. Input errors are 400s with a `code`:
`invalid_uri`, `unknown_trunk`, `invalid_header`, `forbidden_header`, `invalid_value`;
every user-supplied text that reaches a SIP header (`to`, `from` and its display name,
`headers`, a `target_uri`) is refused with a line break or control character, beyond its
length, non-ASCII in a URI (it must be %-escaped), or with `?headers` in a URI.

What a key may dial (outbound_policy.py, trunks.py): a trunk whose `keys` leave it out is
403 `trunk_not_allowed`; a destination outside the trunk's `allow` list is 403
`destination_not_allowed`; more than `--sip-outbound-rate` calls a second is 429
`sip_outbound_rate` with `Retry-After`. Placed calls count against `--max-calls-per-key` and
`--max-sessions` as every call does, from the INVITE on (call_limit.py, cluster placement).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agent.realtime.session_config import session_config_from_realtime
from signaling.auth import Principal, principal_of
from signaling.call_route import CallRoute
from signaling.calls import CALLS_PATH, RESOURCES_KEY, add_call_directory
from signaling.errors import ApiError, read_json_object
from signaling.keys import AGENT_KEY
from signaling.sip.inbound_owner import may_handle
from signaling.sip.outbound import Dialer, OutboundCall, OutboundState, Placement
from signaling.sip.outbound_policy import OutboundRate, safe_text
from signaling.sip.refer import TransferError, Transfers, parse_target
from signaling.sip.trunks import Trunk
from signaling.sip.ua import InboundState, SipCall, UserAgent
from signaling.sip.uri import is_token, parse_name_addr, parse_uri

SIP_CALLS_PATH = "/v1/sip/calls"
# The routes that name a call (the owning worker and node answer them: owned_routes.py).
SIP_CALL = CallRoute(SIP_CALLS_PATH + "/{call_id}")
SIP_HANGUP = CallRoute(SIP_CALLS_PATH + "/{call_id}/hangup")
REFER = CallRoute(CALLS_PATH + "/{call_id}/refer")
CALL_ROUTES = (SIP_CALL, SIP_HANGUP, REFER)
MAX_HEADERS = 20
MAX_HEADER_VALUE = 1024
MAX_URI_CHARS = 512
MAX_DISPLAY_NAME = 128
# Headers the agent writes itself (or that would redirect, forge or break the call).
FORBIDDEN_HEADERS = frozenset({
    "via", "v", "call-id", "i", "cseq", "from", "f", "to", "t", "contact", "m", "max-forwards",
    "content-length", "l", "content-type", "c", "content-encoding", "e", "route",
    "record-route", "authorization", "proxy-authorization", "www-authenticate",
    "proxy-authenticate", "allow", "supported", "k", "require", "proxy-require",
    "user-agent", "expires", "refer-to", "r", "referred-by", "b", "event", "o",
})
UNSAFE_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

Services = Callable[[web.Application], tuple[UserAgent, Dialer, Transfers] | None]


def check_uri(value: object, param: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_URI_CHARS:
        raise ApiError("invalid_uri", f"'{param}' must be a sip: URI of at most "
                       f"{MAX_URI_CHARS} characters", param=param)
    if not value.isascii() or not safe_text(value):
        raise ApiError("invalid_uri", f"'{param}' holds a control or non-ASCII character "
                       "(%-escape it)", param=param)
    uri = parse_uri(value)
    if uri is None or uri.scheme != "sip" or not uri.host or uri.headers is not None \
            or "?" in value:
        raise ApiError("invalid_uri", f"'{param}' must be a sip: URI such as "
                       "sip:+14155550123@sip.example.com (no ?headers)", param=param)
    return value


def check_headers(value: object) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, dict) or len(value) > MAX_HEADERS:
        raise ApiError("invalid_header", f"'headers' must be an object of at most "
                       f"{MAX_HEADERS} header names and string values", param="headers")
    headers: list[tuple[str, str]] = []
    for name, text in value.items():
        if not is_token(name) or len(name) > 64:
            raise ApiError("invalid_header", "a header name must be a token (letters, digits, "
                           "-.!%*_+`'~)", param="headers")
        if name.lower() in FORBIDDEN_HEADERS:
            raise ApiError("forbidden_header", f"the agent writes '{name}' itself; it cannot be "
                           "set", param=f"headers.{name}")
        if not isinstance(text, str) or len(text) > MAX_HEADER_VALUE:
            raise ApiError("invalid_header", f"'headers.{name}' must be a string of at most "
                           f"{MAX_HEADER_VALUE} characters", param=f"headers.{name}")
        if UNSAFE_VALUE.search(text) or not safe_text(text):
            raise ApiError("invalid_header", f"'headers.{name}' holds a line break or control "
                           "character", param=f"headers.{name}")
        headers.append((name, text.strip()))
    return headers


def check_from(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) <= MAX_URI_CHARS and safe_text(value):
        if value.startswith("sip:"):
            value = f"<{value}>"
        parsed = parse_name_addr(value)
        uri = parsed.raw_uri or str(parsed.uri) if parsed is not None else ""
        if parsed is not None and parsed.uri.is_sip and not parsed.params and (
                parsed.uri.headers is None and "?" not in uri and uri.isascii()
                and len(parsed.display_name or "") <= MAX_DISPLAY_NAME):
            return str(parsed)
    raise ApiError("invalid_uri", "'from' must be a sip: URI or a name-addr such as "
                   '"Agent" <sip:agent@example.com> (without a tag or ?headers, the name at '
                   f"most {MAX_DISPLAY_NAME} characters, on one line)", param="from")


def check_allowed(placement: Placement, principal: Principal) -> None:
    """The key may use the trunk, and the trunk may reach the destination (403 otherwise)."""
    trunk = placement.trunk
    if trunk is None:
        return  # a raw sip: URI: bounded by --sip-allow (Dialer.place)
    if not trunk.usable_by(principal.tenant, principal.operator):
        raise ApiError("trunk_not_allowed", f"this key may not place calls through trunk "
                       f"'{trunk.name}' (its 'keys' in --sip-trunks)", param="trunk",
                       status=403)
    if not trunk.allow.permits(placement.target):
        raise ApiError("destination_not_allowed", f"trunk '{trunk.name}' may not call this "
                       "destination (its 'allow' list in --sip-trunks)", param="to",
                       status=403)


def check_rate(rate: OutboundRate, principal: Principal) -> None:
    wait = rate.take(str(principal.tenant))
    if wait > 0:
        raise ApiError("sip_outbound_rate", f"this key places at most {rate.rate:g} outbound "
                       f"calls a second (burst {rate.burst}; --sip-outbound-rate); retry "
                       "shortly", headers={"Retry-After": OutboundRate.retry_after(wait)},
                       status=429)


def placement_from(body: dict[str, Any], trunks: dict[str, Trunk] | Any,
                   default_ring: float) -> Placement:
    target = parse_uri(check_uri(body.get("to"), "to"))
    assert target is not None
    trunk_name = body.get("trunk")
    trunk = None
    if trunk_name is not None:
        if not isinstance(trunk_name, str) or trunk_name not in trunks:
            names = ", ".join(sorted(trunks)) or "none (--sip-trunks)"
            raise ApiError("unknown_trunk", f"no trunk by that name; configured: {names}",
                           param="trunk")
        trunk = trunks[trunk_name]
    ring = body.get("ring_timeout")
    if ring is not None and (isinstance(ring, bool) or not isinstance(ring, (int, float))
                             or not 1 <= ring <= 600):
        raise ApiError("invalid_value", "'ring_timeout' must be 1 to 600 seconds",
                       param="ring_timeout")
    session_body = body.get("session")
    if session_body is not None and not isinstance(session_body, dict):
        raise ApiError("invalid_value", "'session' must be a Realtime session object",
                       param="session")
    session = session_config_from_realtime(session_body or {}, param="session")
    return Placement(target=target, trunk=trunk, from_value=check_from(body.get("from")),
                     headers=check_headers(body.get("headers")), session=session,
                     ring_timeout=float(ring) if ring is not None else None)


# An inbound call's state as its resource shows it (ua.py's states are protocol steps).
INBOUND_STATES = {InboundState.EARLY: "ringing", InboundState.AWAITING_ACK: "answered",
                  InboundState.CONFIRMED: "answered", InboundState.ENDING: "ending"}


def describe_inbound(call: SipCall) -> dict[str, Any]:
    final = call.invite_tx.last_response
    state = INBOUND_STATES.get(call.state, call.state)
    return {"status": state, "transport": "sip", "direction": "inbound", "state": state,
            "remote_party": call.dialog.remote_party, "sip_call_id": call.dialog.call_id,
            "sip_status": final.status if final is not None and final.status >= 200 else None,
            "reason": call.bye_reason, "pending": call.pending}


def describe_outbound(call: OutboundCall) -> dict[str, Any]:
    body = call.describe()
    body.pop("id", None)
    body.pop("object", None)
    body.pop("stats", None)
    remote = call.dialog.remote_party if call.dialog is not None else f"<{body['to']}>"
    return {**body, "transport": "sip", "state": call.state, "remote_party": remote,
            "sip_call_id": call.sip_call_id}


class SipCallDirectory:
    """SIP calls in `/v1/realtime/calls/{id}` (calls.py): inbound ones while they ring (their
    owner's, inbound_owner.py, as accept/reject are) and answered (the leg's
    owner), outbound ones from the INVITE on (the placing key), ended outbound ones while
    `GET /v1/sip/calls/{id}` keeps them."""

    def __init__(self, app: web.Application, services: Services) -> None:
        self.app, self.services = app, services

    def _outbound(self, call_id: str, principal: Principal) -> OutboundCall | None:
        found = self.services(self.app)
        call = found[1].find(call_id) if found is not None else None
        if call is None or not (principal.operator or principal.may_manage(call.owner)):
            return None
        return call

    def _inbound(self, call_id: str, principal: Principal) -> SipCall | None:
        found = self.services(self.app)
        call = found[0].find_call(call_id) if found is not None else None
        if call is None or found is None:
            return None
        owner = call.leg.owner if call.leg is not None else None
        if isinstance(owner, Principal):
            return call if principal.operator or principal.may_manage(owner) else None
        # ringing: its owner's (inbound_owner.py), or any key's where it has none
        return call if may_handle(principal, call, found[0].config) else None

    def describe(self, call_id: str, principal: Principal) -> dict[str, Any] | None:
        outbound = self._outbound(call_id, principal)
        if outbound is not None:
            return describe_outbound(outbound)
        inbound = self._inbound(call_id, principal)
        return describe_inbound(inbound) if inbound is not None else None

    async def end(self, call_id: str, principal: Principal) -> bool:
        outbound = self._outbound(call_id, principal)
        if outbound is not None and outbound.state in (OutboundState.CALLING,
                                                       OutboundState.RINGING):
            found = self.services(self.app)
            assert found is not None
            await found[1].hang_up(outbound)  # CANCEL (once a provisional came)
            return True
        inbound = self._inbound(call_id, principal)
        if inbound is not None and inbound.pending:
            found = self.services(self.app)
            assert found is not None
            found[0].reject(inbound, 603)
            return True
        return False


def install_routes(app: web.Application, services: Services) -> None:
    """`services(app)`: the running user agent, dialer and transfers, or None."""
    add_call_directory(app, SipCallDirectory(app, services))

    def running(request: web.Request) -> tuple[UserAgent, Dialer, Transfers]:
        found = services(request.app)
        if found is None:
            raise ApiError("sip_not_running", "the SIP user agent is not running", status=503)
        return found

    def owned_call(request: web.Request) -> tuple[Dialer, OutboundCall]:
        _, dialer, _ = running(request)
        call = dialer.find(request.match_info["call_id"])
        principal = principal_of(request)
        if call is None or not (principal.operator or principal.may_manage(call.owner)):
            raise ApiError("call_not_found", "no such call", param="call_id", status=404)
        return dialer, call

    rates: list[OutboundRate] = []  # one, made with the first call (the UA's settings)

    async def post_call(request: web.Request) -> web.Response:
        ua, dialer, _ = running(request)
        body = await read_json_object(request)
        placement = placement_from(body, dialer.trunks, dialer.ring_timeout)
        principal: Principal = principal_of(request)
        check_allowed(placement, principal)
        if not rates:
            rates.append(OutboundRate(ua.config.outbound_rate, ua.config.outbound_burst))
        check_rate(rates[0], principal)
        call = await dialer.place(placement, principal)
        location = f"{SIP_CALLS_PATH}/{call.api_id}"
        return web.json_response(call.describe(), status=201, headers={"Location": location})

    async def get_call(request: web.Request) -> web.Response:
        _, call = owned_call(request)
        return web.json_response(call.describe())

    async def delete_call(request: web.Request) -> web.Response:
        dialer, call = owned_call(request)
        await dialer.hang_up(call)
        return web.json_response(call.describe())

    async def refer(request: web.Request) -> web.Response:
        ua, dialer, transfers = running(request)
        call_id = request.match_info["call_id"]
        # 404 for an unknown call or another key's, as the other call routes answer.
        request.app[RESOURCES_KEY].lookup(call_id, principal_of(request))
        body = await read_json_object(request)
        target = parse_target(body.get("target_uri"))
        written = str(body.get("target_uri"))
        if target.headers is not None or "?" in written or not written.isascii() \
                or not safe_text(written):
            raise TransferError("invalid_target", "'target_uri' may not carry ?headers or "
                                "non-ASCII characters (%-escape them)", param="target_uri")
        leg = request.app[AGENT_KEY].legs.get(call_id)
        if leg is None or not leg.can.refer:
            raise TransferError("not_a_sip_call", "only SIP calls can be transferred",
                                status=409)
        inbound = ua.find_call(call_id)
        outbound = dialer.find(call_id)
        if inbound is not None and inbound.state == InboundState.CONFIRMED:
            dialog, flow = inbound.dialog, inbound.flow
        elif (outbound is not None and outbound.state == OutboundState.ANSWERED
              and outbound.dialog):
            dialog, flow = outbound.dialog, outbound.flow
        else:
            raise TransferError("call_not_established", "the call is not established (no "
                                "ACK yet, or ending)", status=409)
        transfer = await transfers.refer(call_id, dialog, flow, leg, target)
        return web.json_response({"id": call_id, "object": "realtime.call.refer",
                                  "status": transfer.state, "target_uri": str(target),
                                  "sip_status": transfer.sip_status}, status=202)

    app.router.add_post(SIP_CALLS_PATH, post_call)
    SIP_CALL.add(app.router, "GET", get_call)
    SIP_CALL.add(app.router, "DELETE", delete_call)
    SIP_HANGUP.add(app.router, "POST", delete_call)
    REFER.add(app.router, "POST", refer)
