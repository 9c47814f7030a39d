"""Telephony routes: the media-stream websocket and plain RTP legs (HTTP side only).

- `GET /v1/telephony/media-stream` (path configurable): a Twilio-style media-stream
  websocket; the protocol lives in `agent.telephony.media_stream`. Bridges often cannot
  set headers, so this path also takes the API key as `?token=KEY`, or as a last path
  segment, `/v1/telephony/media-stream/KEY`, for bridges whose stream URL cannot carry a
  query string (Twilio's `<Stream url>`). The route part must be spelled as configured:
  a percent-encoded spelling that decodes to it (`/v1/telephony/media%2Dstream/KEY`) is
  refused with 400 `non_canonical_path` before auth, so a key never authenticates through a
  spelling the log filters might not recognise.
- `POST /v1/telephony/rtp` `{"remote": "HOST:PORT" (optional: latch to the first sender),
  "codec": "PCMU"|"PCMA"|"L16/16000", "dtmf_payload_type": 101, "session": {...}}` → 201
  `{"call_id", "local",
  "codec", ...}`; `GET`/`DELETE /v1/telephony/rtp/{call_id}`.
Admission (server full → 503 + Retry-After) and auth are the same as for WebRTC calls.
A `remote` outside `--rtp-allow` gets 403 `address_not_allowed`; multicast, broadcast,
link-local and unspecified ones 400 `address_not_permitted` (agent/telephony/address_policy.py).
"""

from __future__ import annotations

import argparse
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from aiohttp import WSMsgType, web
from yarl import URL

from agent.end_reason import EndReason
from agent.leg import Leg
from agent.media_agent import ON_PLACED
from agent.plugins.base import SessionConfig
from agent.telephony.address_policy import DEFAULT_RTP_ALLOW, parse_networks
from agent.telephony.media_stream import MediaStreamLeg
from agent.telephony.rtp_leg import (
    RtpSettings,
    check_remote,
    open_rtp_leg,
)
from signaling.auth import principal_of
from signaling.call_route import CallRoute
from signaling.calls import RESOURCES_KEY
from signaling.errors import ApiError, error_response, read_json_object
from signaling.keys import AGENT_KEY
from signaling.rtp_body import codec_from_request, dtmf_payload_type_from_request, parse_host_port

log = logging.getLogger(__name__)

DEFAULT_MEDIA_STREAM_PATH = "/v1/telephony/media-stream"
RTP_PATH = "/v1/telephony/rtp"
QUERY_TOKEN = "token"
MAX_WS_MESSAGE_BYTES = 1 << 20  # larger frames close the socket; smaller bad ones get `error`


@dataclass(frozen=True)
class TelephonyConfig:
    media_stream_path: str = DEFAULT_MEDIA_STREAM_PATH
    rtp: RtpSettings = field(default_factory=RtpSettings)


TELEPHONY_KEY = web.AppKey("telephony", TelephonyConfig)
# Set where several workers serve: carries a websocket this full worker cannot take to one
# that can (signaling/workers/relay.py); None when all are full.
Overflow = Callable[[web.Request, int], Awaitable["web.WebSocketResponse | None"]]
OVERFLOW_KEY = web.AppKey[Overflow]("media_stream_overflow")


# -- auth seam: a query-string token becomes the Bearer header the auth middleware reads ----


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def url_token(request: web.Request, path: str) -> str | None:
    """The key a media-stream URL carries (`?token=` or the last segment); none from a
    non-canonical spelling of the route, wherever the token is read (auth, worker routing)."""
    if not is_canonical(request, path):
        return None
    if request.path == path:
        return request.query.get(QUERY_TOKEN) or None
    if request.path.startswith(path + "/"):
        return request.match_info.get("token") or None
    return None


def with_url_token(request: web.Request, path: str) -> web.Request:
    """The request with its URL token (if any, and no header) as its Authorization header."""
    token = url_token(request, path)
    if token and "Authorization" not in request.headers:
        return request.clone(headers={**request.headers, "Authorization": f"Bearer {token}"})
    return request


@functools.lru_cache(maxsize=8)
def _raw_route(path: str) -> str:
    """The route as a request line spells it (percent-encoded only where it must be)."""
    return URL.build(path=path).raw_path


def is_canonical(request: web.Request, path: str) -> bool:
    """False for a request routed to the media-stream `path` (or under it) whose request
    line spells the route differently: percent-encoded characters that decode to it. The
    token segment after it may be percent-encoded (a key may need it)."""
    decoded = request.path
    if decoded != path and not decoded.startswith(path + "/"):
        return True  # not this route
    raw, route = request.rel_url.raw_path, _raw_route(path)
    return raw == route or raw.startswith(route + "/")


def non_canonical_refusal(path: str) -> web.Response:
    return error_response(ApiError(
        "non_canonical_path",
        f"write the media-stream path as {path}, without percent-encoding", status=400))


def url_token_middleware(path: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_canonical(request, path):
            # Answered here, before auth; url_token gives such a spelling no key anyway.
            return non_canonical_refusal(path)
        return await handler(with_url_token(request, path))

    return middleware


# -- media-stream websocket -------------------------------------------------------------------


async def media_stream(request: web.Request) -> web.StreamResponse:
    agent = request.app[AGENT_KEY]
    socket = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, compress=False)
    if not socket.can_prepare(request).ok:
        raise ApiError("websocket_required", "this endpoint speaks WebSocket only",
                       headers={"Upgrade": "websocket"}, status=426)

    async def close_socket(code: int, message: str) -> None:
        await socket.close(code=code, message=message.encode("utf-8")[:120])

    overflow = request.app.get(OVERFLOW_KEY)
    if overflow is not None and not agent.draining and not agent.has_room:
        on_placed = ON_PLACED.get()
        if on_placed is not None:
            on_placed()  # held by the worker it is relayed to, not here
        relayed = await overflow(request, MAX_WS_MESSAGE_BYTES)
        if relayed is not None:
            return relayed
    with agent.admit():  # a full server answers 503 before the upgrade
        await socket.prepare(request)
        session = MediaStreamLeg(agent, socket.send_str, close_socket)
    request.app[RESOURCES_KEY].add(session.id, principal_of(request))
    log.info("media stream %s open from %s", session.id, request.remote)
    try:
        async for message in socket:
            if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                await session.handle_message(message.data)
            if session.closing:
                break
    finally:
        await session.close(session.end_reason or EndReason.SOCKET_CLOSED)
    return socket


# -- plain RTP legs ---------------------------------------------------------------------------


async def post_rtp(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    settings = request.app[TELEPHONY_KEY].rtp
    body = await read_json_object(request)
    remote = parse_host_port(body["remote"], "remote") if body.get("remote") is not None else None
    if remote is not None:
        check_remote(remote[0], settings)  # before anything is bound: no reflection
    codec = codec_from_request(body.get("codec", "PCMU"))
    dtmf_payload_type = dtmf_payload_type_from_request(body, codec)
    session = SessionConfig.from_json(body.get("session"))
    strict = body.get("strict_remote_port", settings.strict_remote_port)
    if not isinstance(strict, bool):
        raise ApiError("invalid_parameter", "'strict_remote_port' must be true or false",
                       param="strict_remote_port")
    settings = replace(settings, strict_remote_port=strict)
    leg = await open_rtp_leg(agent, remote, codec, session, settings, dtmf_payload_type)
    request.app[RESOURCES_KEY].add(leg.id, principal_of(request))
    location = f"{RTP_PATH}/{leg.id}"
    return web.json_response(
        {"call_id": leg.id, "local": leg.local_text, "codec": codec.name,
         "remote": body.get("remote"), "payload_type": leg.stats()["payload_type"],
         "dtmf_payload_type": dtmf_payload_type},
        status=201, headers={"Location": location},
    )


def _rtp_leg(request: web.Request) -> Leg:
    call_id = request.match_info["call_id"]
    try:
        request.app[RESOURCES_KEY].lookup(call_id, principal_of(request))
    except ApiError:
        raise ApiError("not_found", "no such RTP leg", status=404) from None
    leg = request.app[AGENT_KEY].legs.get(call_id, "rtp")
    if leg is None:
        raise ApiError("not_found", "no such RTP leg", status=404)
    return leg


async def get_rtp(request: web.Request) -> web.Response:
    return web.json_response(_rtp_leg(request).stats())


async def delete_rtp(request: web.Request) -> web.Response:
    leg = _rtp_leg(request)
    await leg.close(EndReason.HANGUP)
    return web.json_response({"call_id": leg.id, "ended": True, "reason": leg.end_reason})


# The routes that name a leg (its owning worker and node answer them: owned_routes.py).
RTP_LEG = CallRoute(RTP_PATH + "/{call_id}")
CALL_ROUTES = (RTP_LEG,)


def add_routes(app: web.Application, config: TelephonyConfig | None = None) -> None:
    config = config or TelephonyConfig()
    app[TELEPHONY_KEY] = config
    # In front of the auth middleware (inserted first, so it runs first): the token from the
    # URL is in place before auth looks for one.
    app.middlewares.insert(0, url_token_middleware(config.media_stream_path))
    app.router.add_get(config.media_stream_path, media_stream)
    app.router.add_get(config.media_stream_path + "/{token}", media_stream)
    app.router.add_post(RTP_PATH, post_rtp)
    RTP_LEG.add(app.router, "GET", get_rtp)
    RTP_LEG.add(app.router, "DELETE", delete_rtp)


# -- command line -----------------------------------------------------------------------------


def _port_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError("expected MIN-MAX, e.g. 40000-40999") from None
    if not 1024 <= first <= last <= 65535:
        raise argparse.ArgumentTypeError("ports must satisfy 1024 <= MIN <= MAX <= 65535")
    return first, last


def network_argument(text: str) -> str:
    """A CIDR flag value (`--rtp-allow`, `--sip-allow`), checked as the allow lists parse it."""
    try:
        parse_networks([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("telephony")
    group.add_argument("--media-stream-path", default=DEFAULT_MEDIA_STREAM_PATH,
                       help=f"websocket path for bridges (default {DEFAULT_MEDIA_STREAM_PATH})")
    group.add_argument("--rtp-bind", default="127.0.0.1", metavar="ADDR",
                       help="address RTP legs bind (default 127.0.0.1; 0.0.0.0 for a PBX "
                       "on another host)")
    group.add_argument("--rtp-advertise", default=None, metavar="ADDR",
                       help="address returned as 'local' (default: --rtp-bind)")
    group.add_argument("--rtp-ports", type=_port_range, default=(40000, 40999), metavar="MIN-MAX",
                       help="UDP port range for RTP legs (default 40000-40999)")
    group.add_argument("--rtp-allow", action="append", type=network_argument, default=None,
                       metavar="CIDR",
                       help="network an RTP leg may send to or latch onto (repeatable; "
                       f"default {' '.join(DEFAULT_RTP_ALLOW)}; multicast, broadcast, "
                       "link-local and unspecified addresses are always refused)")
    group.add_argument("--rtp-jitter", type=int, default=3, metavar="PACKETS",
                       help="RTP playout delay in 20 ms units, whatever the sender's packet "
                       "duration (default 3)")
    group.add_argument("--rtp-strict-remote-port", action="store_true",
                       help="with a 'remote', take RTP only from that exact port (default: from "
                       "its IP, on the first port it sends from)")


def config_from_args(args: argparse.Namespace) -> TelephonyConfig:
    path = "/" + args.media_stream_path.lstrip("/")
    advertised = args.rtp_advertise
    if advertised is None and args.rtp_bind in ("0.0.0.0", "::"):
        log.warning("--rtp-bind %s without --rtp-advertise: 'local' will not be reachable; "
                    "set --rtp-advertise to this host's address", args.rtp_bind)
    return TelephonyConfig(
        media_stream_path=path,
        rtp=RtpSettings(bind_host=args.rtp_bind, advertised_host=advertised,
                        port_min=args.rtp_ports[0], port_max=args.rtp_ports[1],
                        jitter_packets=max(1, args.rtp_jitter),
                        strict_remote_port=args.rtp_strict_remote_port,
                        allowed_networks=parse_networks(args.rtp_allow or DEFAULT_RTP_ALLOW)),
    )
