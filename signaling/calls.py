"""OpenAI-Realtime / WHIP-style call resources: `/v1/realtime/calls`.

`POST /v1/realtime/calls` (application/sdp offer, or multipart `sdp` + `session`, and a
`voice_audio` recording where `--max-voice-upload-bytes` allows it) creates a
call and answers `201 Created` with the SDP answer, `Location`, `ETag` and one `Link` per ICE
server. The call resource then takes `GET` (its session and live stats; every other call,
RTP, media-stream or SIP, answers it too with its `transport`, SIP calls with their
signalling state through the registered `CallDirectory`s, even before a leg exists), `DELETE` /
`POST .../hangup` (end it), `PATCH` (trickled ICE candidates, or an ICE restart with new
credentials: RFC 9725 section 4.4, `If-Match` required, answered 200 with the agent's new
credentials and a new `ETag`) and `POST` of a new SDP offer (a re-offer restarting ICE, for
clients that renegotiate; the same call goes on). A call belongs to the
credential that created it; asking about someone else's call gets the same 404 as an unknown
id, so ids cannot be probed.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from typing import Any, Protocol

from aiohttp import BodyPartReader, web

from agent.leg import Leg
from agent.media_agent import MediaAgent
from agent.plugins.base import SessionConfig
from agent.realtime import client_json
from agent.realtime.session_config import session_config_from_realtime
from agent.telephony.dtmf_sender import check_digits
from agent.webrtc.leg import WebRtcLeg
from agent.webrtc.sdp import MAX_SDP_BYTES
from agent.webrtc.trickle import parse_sdpfrag
from signaling.auth import Principal, principal_of, secret_session
from signaling.call_route import CallRoute
from signaling.errors import ApiError, read_json_object
from signaling.ice import link_headers
from signaling.keys import AGENT_KEY

CALLS_PATH = "/v1/realtime/calls"
SDP_TYPE = "application/sdp"
MULTIPART_TYPE = "multipart/form-data"
TRICKLE_TYPE = "application/trickle-ice-sdpfrag"
MAX_SESSION_JSON_BYTES = 64 * 1024
MAX_MULTIPART_BYTES = MAX_SDP_BYTES + MAX_SESSION_JSON_BYTES + 8 * 1024
VOICE_AUDIO_FIELD = "voice_audio"  # a voice recording uploaded with the offer
VOICE_UPLOAD_BYTES_KEY = web.AppKey("voice_upload_bytes", int)  # 0: uploads refused


@dataclass
class CallResource:
    call_id: str
    etag: str
    owner: Principal


class CallResources:
    """The HTTP view of the agent's leg registry: a leg's owner (kept on the leg, so the one
    registry answers who may see it) and its ETag. Every route that reads, changes, ends or
    lists a call or leg asks here; another tenant's is a 404, so ids cannot be probed."""

    def __init__(self, agent: MediaAgent) -> None:
        self.agent = agent

    def add(self, call_id: str, owner: Principal) -> CallResource:
        leg = self.agent.legs.get(call_id)
        if leg is None:
            raise ApiError("call_not_found", "the call ended during setup", status=404)
        leg.owner = owner
        return CallResource(call_id, etag_of(call_id, ice_generation(leg)), owner)

    def _owner(self, call_id: str) -> object | None:
        leg = self.agent.legs.get(call_id)
        return leg.owner if leg is not None else None

    def visible_to(self, principal: Principal, call_id: str) -> bool:
        owner = self._owner(call_id)
        if principal.operator:
            return True
        if isinstance(owner, Principal):
            return principal.may_manage(owner)
        return owner is None and principal.kind == "open"

    def lookup(self, call_id: str, principal: Principal) -> CallResource:
        owner = self._owner(call_id)
        if not isinstance(owner, Principal) or not principal.may_manage(owner):
            raise ApiError("call_not_found", "no such call", param="call_id", status=404)
        leg = self.agent.legs.get(call_id)
        return CallResource(call_id, etag_of(call_id, ice_generation(leg)), owner)


def ice_generation(leg: Leg | None) -> int:
    """How many ICE restarts a call has begun (0 for legs that have no ICE)."""
    return leg.ice_generation if leg is not None and leg.can.ice_restart else 0


def etag_of(call_id: str, generation: int = 0) -> str:
    """A call's ETag: one per ICE generation (an ICE restart changes it, RFC 9725 section
    4.4), and not guessable from anything else public."""
    data = call_id.encode() if generation == 0 else f"{call_id}/{generation}".encode()
    return '"' + hashlib.blake2s(data, key=ETAG_KEY, digest_size=9).hexdigest() + '"'


ETAG_KEY = secrets.token_bytes(16)
RESOURCES_KEY = web.AppKey("call_resources", CallResources)


class CallDirectory(Protocol):
    """Calls known to signalling beyond the leg registry (SIP calls: ringing, answered or
    ended), for `GET`, `DELETE` and `/hangup` of `/v1/realtime/calls/{id}`."""

    def describe(self, call_id: str, principal: Principal) -> dict[str, Any] | None:
        """The call's fields (`status`, `transport`, ...), None when unknown or not the
        principal's."""

    async def end(self, call_id: str, principal: Principal) -> bool:
        """End a call that has no leg yet (a CANCEL); False when it is not one of those."""


CALL_DIRECTORIES_KEY = web.AppKey("call_directories", list)


def add_call_directory(app: web.Application, directory: CallDirectory) -> None:
    app[CALL_DIRECTORIES_KEY] = [*app.get(CALL_DIRECTORIES_KEY, []), directory]


def directory_view(app: web.Application, call_id: str,
                   principal: Principal) -> dict[str, Any] | None:
    for directory in app.get(CALL_DIRECTORIES_KEY, ()):
        view = directory.describe(call_id, principal)
        if view is not None:
            return dict(view)
    return None


def media_type(request: web.Request) -> str:
    return request.content_type.lower()


async def read_limited(request: web.Request, limit: int, what: str) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError("body_too_large", f"{what} is limited to {limit} bytes", status=413)
    body = await request.read()
    if len(body) > limit:
        raise ApiError("body_too_large", f"{what} is limited to {limit} bytes", status=413)
    return body


def decode_text(body: bytes, param: str) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_encoding", f"'{param}' must be UTF-8 text",
                       param=param) from None


async def read_offer(request: web.Request) -> tuple[str, SessionConfig | None]:
    """The offer SDP and the offer-time session config (multipart only)."""
    kind = media_type(request)
    if kind == SDP_TYPE:
        body = await read_limited(request, MAX_SDP_BYTES, "the SDP offer")
        return decode_text(body, "sdp"), None
    if kind == MULTIPART_TYPE:
        return await read_multipart_offer(request)
    raise ApiError(
        "unsupported_media_type",
        f"send the offer as {SDP_TYPE} or {MULTIPART_TYPE} (sdp, session)",
        status=415, headers={"Accept-Post": f"{SDP_TYPE}, {MULTIPART_TYPE}"},
    )


async def read_multipart_offer(request: web.Request) -> tuple[str, SessionConfig | None]:
    # Streaming multipart reads bypass aiohttp's body limit, so bound the whole body here.
    upload_limit = request.app.get(VOICE_UPLOAD_BYTES_KEY, 0)
    body_limit = MAX_MULTIPART_BYTES + upload_limit
    if request.content_length is None:
        raise ApiError("length_required", "multipart offers need a Content-Length", status=411)
    if request.content_length > body_limit:
        raise ApiError("body_too_large",
                       f"multipart offers are limited to {body_limit} bytes", status=413)
    try:
        reader = await request.multipart()
    except Exception:
        raise ApiError("invalid_multipart", "the multipart body cannot be read") from None
    fields: dict[str, bytes] = {}
    limits = {"sdp": MAX_SDP_BYTES, "session": MAX_SESSION_JSON_BYTES,
              VOICE_AUDIO_FIELD: upload_limit}
    try:
        while (part := await reader.next()) is not None:
            name = getattr(part, "name", None)
            # (a nested multipart part has no name, so it is an unknown field too)
            if name not in limits or not isinstance(part, BodyPartReader):
                raise ApiError("unknown_field", f"unknown form field {name!r} "
                               f"(expected sdp, session, {VOICE_AUDIO_FIELD})")
            if name == VOICE_AUDIO_FIELD and upload_limit == 0:
                raise ApiError("voice_upload_disabled", "this server takes no uploaded voice "
                               "recordings (--max-voice-upload-bytes)", param=name, status=403)
            if name in fields:
                raise ApiError("duplicate_field", f"form field '{name}' appears twice",
                               param=name)
            data = bytearray()
            while chunk := await part.read_chunk(8192):
                data += chunk
                if len(data) > limits[name]:
                    raise ApiError("body_too_large",
                                   f"form field '{name}' is limited to {limits[name]} bytes",
                                   param=name, status=413)
            fields[name] = bytes(data)
    except ApiError:
        raise
    except web.HTTPRequestEntityTooLarge:
        raise
    except Exception:
        raise ApiError("invalid_multipart", "the multipart body is malformed") from None
    if "sdp" not in fields:
        raise ApiError("missing_sdp", "form field 'sdp' is required", param="sdp")
    sdp = decode_text(fields["sdp"], "sdp")
    session = None
    if "session" in fields:
        try:
            obj: Any = client_json.loads(decode_text(fields["session"], "session"))
        except client_json.ClientJsonError:
            raise ApiError("invalid_json", "form field 'session' is not valid JSON",
                           param="session") from None
        session = session_config_from_realtime(obj, param="session")
    if VOICE_AUDIO_FIELD in fields:
        session = replace(session or SessionConfig(), voice_audio=fields[VOICE_AUDIO_FIELD])
        if session.voice is not None:
            raise ApiError("conflicting_voice", f"give either session.voice or a "
                           f"'{VOICE_AUDIO_FIELD}' recording, not both", param="session.voice")
    return sdp, session


def call_location(call_id: str) -> str:
    return f"{CALLS_PATH}/{call_id}"


async def post_call(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    principal = principal_of(request)
    sdp, offered = await read_offer(request)
    session = offered or SessionConfig()
    bound = secret_session(request)
    if bound is not None:
        # The secret's bound config is what its minter allowed; the browser fills the rest.
        session = session.merged(bound)
    agent.check_capacity()  # refuse before spending the secret
    principal.consume()
    try:
        call, answer_sdp = await agent.create_call(sdp, session)
    except BaseException:
        principal.release()
        raise
    principal.claim(call.id)
    resource = request.app[RESOURCES_KEY].add(call.id, principal)
    headers = {
        "Location": call_location(call.id),
        "ETag": resource.etag,
        "Content-Type": SDP_TYPE,
    }
    response = web.Response(status=201, text=answer_sdp, headers=headers)
    for link in link_headers(agent.settings.ice_servers):
        response.headers.add("Link", link)
    return response


async def get_call(request: web.Request) -> web.Response:
    """Any call: a WebRTC call (its session), an RTP, media-stream or SIP leg, or a SIP call
    that has no leg (yet, or any more: ringing, ended); every one with its `transport`, SIP
    calls with their signalling state from the call directories."""
    call_id, principal = request.match_info["call_id"], principal_of(request)
    leg = request.app[AGENT_KEY].legs.get(call_id)
    signalling = directory_view(request.app, call_id, principal)
    if leg is None or (signalling is None and leg.closing):
        if signalling is None:
            raise ApiError("call_not_found", "no such call", param="call_id", status=404)
        return web.json_response({"id": call_id, "object": "realtime.call", **signalling})
    resource = request.app[RESOURCES_KEY].lookup(call_id, principal)
    body: dict[str, Any] = {"id": leg.id, "object": "realtime.call", "status": "active",
                            "transport": leg.transport}
    if leg.can.realtime_session:
        body["session"] = leg.describe_session()
    body.update({key: value for key, value in (signalling or {}).items() if key != "status"})
    body["stats"] = leg.stats()
    return web.json_response(body, headers={"ETag": resource.etag})


async def delete_call(request: web.Request) -> web.Response:
    call_id, principal = request.match_info["call_id"], principal_of(request)
    if request.app[AGENT_KEY].legs.get(call_id) is None:
        for directory in request.app.get(CALL_DIRECTORIES_KEY, ()):
            if await directory.end(call_id, principal):  # a ringing SIP call: CANCEL
                return web.json_response({"id": call_id, "object": "realtime.call",
                                          "status": "ended"})
    resource = request.app[RESOURCES_KEY].lookup(call_id, principal)
    await request.app[AGENT_KEY].hangup(resource.call_id)
    return web.json_response({"id": resource.call_id, "object": "realtime.call", "status": "ended"})


async def hangup_call(request: web.Request) -> web.Response:
    return await delete_call(request)


def check_if_match(request: web.Request, resource: CallResource) -> str | None:
    """The request's If-Match (None when absent); 412 when it names another ETag."""
    if_match = request.headers.get("If-Match")
    if if_match is not None and if_match.strip() not in ("*", resource.etag):
        raise ApiError("etag_mismatch", "If-Match does not name this call's ETag", status=412)
    return if_match


def webrtc_call(request: web.Request, resource: CallResource) -> WebRtcLeg:
    call = request.app[AGENT_KEY].webrtc_legs.get(resource.call_id)
    if call is None:
        raise ApiError("call_not_found", "no such call", param="call_id", status=404)
    return call


async def patch_call(request: web.Request) -> web.Response:
    """Trickled ICE candidates (RFC 9725 section 4.3.1), or an ICE restart (section 4.4):
    new credentials, `If-Match` required, answered 200 with the agent's new credentials and
    candidates and the new ETag."""
    resources = request.app[RESOURCES_KEY]
    resource = resources.lookup(request.match_info["call_id"], principal_of(request))
    if_match = check_if_match(request, resource)
    if media_type(request) != TRICKLE_TYPE:
        raise ApiError("unsupported_media_type", f"trickle candidates as {TRICKLE_TYPE}",
                       status=415)
    body = decode_text(await read_limited(request, MAX_SDP_BYTES, "the SDP fragment"), "sdp")
    call = webrtc_call(request, resource)
    fragment = parse_sdpfrag(body)  # TrickleError is a coded 4xx
    if call.ice.is_restart(fragment.ice_ufrag):
        if if_match is None:
            raise ApiError("precondition_required", "an ICE restart needs If-Match with the "
                           "call's ETag (or *)", status=428)
        answer = await call.ice.restart_from_fragment(fragment)
        etag = resources.lookup(resource.call_id, principal_of(request)).etag
        return web.Response(status=200, text=answer,
                            headers={"ETag": etag, "Content-Type": TRICKLE_TYPE})
    await call.ice.trickle(fragment)
    return web.Response(status=204, headers={"ETag": resource.etag})


async def reoffer_call(request: web.Request) -> web.Response:
    """A new SDP offer on the same call (clients that renegotiate to restart ICE): the
    answer carries the agent's new ICE credentials; the call, its plugin session, recording
    and events go on."""
    resources = request.app[RESOURCES_KEY]
    resource = resources.lookup(request.match_info["call_id"], principal_of(request))
    check_if_match(request, resource)
    if media_type(request) != SDP_TYPE:
        raise ApiError("unsupported_media_type", f"send the new offer as {SDP_TYPE}",
                       status=415, headers={"Accept-Post": SDP_TYPE})
    sdp = decode_text(await read_limited(request, MAX_SDP_BYTES, "the SDP offer"), "sdp")
    answer = await webrtc_call(request, resource).ice.reoffer(sdp)
    etag = resources.lookup(resource.call_id, principal_of(request)).etag
    return web.Response(status=200, text=answer,
                        headers={"ETag": etag, "Content-Type": SDP_TYPE})


async def post_dtmf(request: web.Request) -> web.Response:
    """`{"digits": "12#"}`: RFC 4733 telephone-events on an RTP or SIP leg's own stream."""
    resource = request.app[RESOURCES_KEY].lookup(
        request.match_info["call_id"], principal_of(request)
    )
    body = await read_json_object(request)
    try:
        digits = check_digits(body.get("digits"))
    except ValueError as exc:
        raise ApiError("invalid_value", str(exc), param="digits") from None
    leg = request.app[AGENT_KEY].legs.get(resource.call_id)
    if leg is None:
        raise ApiError("call_not_found", "no such call", param="call_id", status=404)
    if not leg.can.dtmf:
        raise ApiError("dtmf_not_negotiated", "DTMF is sent on RTP and SIP calls only",
                       status=409)
    queued = leg.send_dtmf(digits)  # CallError 409: no telephone-event, no remote, too many
    return web.json_response({"id": leg.id, "object": "realtime.call.dtmf", "digits": digits,
                              "queued": queued})


# The routes that name a call (the owning worker and node answer them: owned_routes.py).
CALL = CallRoute(CALLS_PATH + "/{call_id}")
HANGUP = CallRoute(CALLS_PATH + "/{call_id}/hangup")
DTMF = CallRoute(CALLS_PATH + "/{call_id}/dtmf")
CALL_ROUTES = (CALL, HANGUP, DTMF)


def add_routes(app: web.Application) -> None:
    app[RESOURCES_KEY] = CallResources(app[AGENT_KEY])
    app.router.add_post(CALLS_PATH, post_call)
    CALL.add(app.router, "GET", get_call)
    CALL.add(app.router, "DELETE", delete_call)
    CALL.add(app.router, "PATCH", patch_call)
    CALL.add(app.router, "POST", reoffer_call)
    HANGUP.add(app.router, "POST", hangup_call)
    DTMF.add(app.router, "POST", post_dtmf)
