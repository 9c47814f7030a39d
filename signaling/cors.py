"""CORS for browsers on other origins, and `OPTIONS` answers with `Accept-Post` (RFC 9725).

Which foreign origins are granted:
- `--cors-origin ORIGIN` (repeatable) names them; `--cors-origin '*'` grants any.
- Without the flag, a server with `--api-key` grants any origin: credentials travel as Bearer
  tokens, never cookies, so a foreign page can do nothing a key holder did not give it.
- Without the flag, an open server (no `--api-key`, typically a laptop) grants none: any web
  page the user visits could otherwise drive it (start calls, RTP legs) and read the answers.
  On such a server a request from a foreign origin that would change something (any method
  but GET/HEAD/OPTIONS, or a websocket upgrade, which browsers do not subject to CORS) is
  refused with 403 `origin_not_allowed`. The page served by the agent itself is same-origin
  and unaffected.
Every response (errors included) exposes the headers a WHIP or Realtime client reads:
`Location`, `ETag`, `Link`, `Retry-After`.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from aiohttp import web

from signaling.errors import json_error

ALLOW_HEADERS = "Authorization, Content-Type, If-Match"
EXPOSE_HEADERS = "Location, ETag, Link, Retry-After, Accept-Post"
ACCEPT_POST = "application/sdp, multipart/form-data"
PREFLIGHT_MAX_AGE = "600"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ORIGINS_KEY = web.AppKey("cors_origins", tuple)
OPEN_SERVER_KEY = web.AppKey("cors_open_server", bool)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def same_origin(request: web.Request, origin: str) -> bool:
    """The Origin names this server (scheme ignored: a TLS proxy may sit in front)."""
    _, sep, host = origin.partition("://")
    return bool(sep) and host.lower() == request.host.lower()


def allowed_origin(request: web.Request) -> str | None:
    """The Access-Control-Allow-Origin value for this request, or None for none."""
    origins: tuple[str, ...] = request.app[ORIGINS_KEY]
    origin = request.headers.get("Origin")
    if "*" in origins or (not origins and not request.app[OPEN_SERVER_KEY]):
        return "*"
    return origin if origin is not None and origin in origins else None


def foreign_origin_refused(request: web.Request) -> bool:
    """An open server without --cors-origin: a foreign page may not change anything."""
    origin = request.headers.get("Origin")
    if origin is None or not request.app[OPEN_SERVER_KEY]:
        return False  # not a browser (or an old one), or keys protect the server
    if allowed_origin(request) is not None or same_origin(request, origin):
        return False
    upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
    return upgrade or request.method not in SAFE_METHODS


def _allowed_methods(request: web.Request) -> set[str] | None:
    """The methods the path takes, or None when the path does not exist."""
    exception = request.match_info.http_exception
    if exception is None:
        return {request.method}
    if isinstance(exception, web.HTTPMethodNotAllowed):
        return set(exception.allowed_methods)
    return None


def preflight(request: web.Request) -> web.Response:
    methods = _allowed_methods(request)
    if methods is None:
        return json_error(404, "not_found", "no such resource")
    methods.discard("OPTIONS")
    headers = {
        "Allow": ", ".join(sorted(methods | {"OPTIONS"})),
        "Access-Control-Allow-Methods": ", ".join(sorted(methods | {"OPTIONS"})),
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
    }
    if "POST" in methods and request.path.rstrip("/").endswith("/calls"):
        headers["Accept-Post"] = ACCEPT_POST
    if "PATCH" in methods:
        headers["Accept-Patch"] = "application/trickle-ice-sdpfrag"
    return web.Response(status=204, headers=headers)


@web.middleware
async def cors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if foreign_origin_refused(request):
        response: web.StreamResponse = json_error(
            403, "origin_not_allowed",
            "this server has no --api-key and does not allow requests from this origin "
            "(see --cors-origin)")
    elif request.method == "OPTIONS":
        response = preflight(request)
    else:
        response = await handler(request)
    return with_cors_headers(request, response)


def with_cors_headers(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """The response, with the CORS headers this request's origin is granted."""
    origin = allowed_origin(request)
    if origin is not None and not response.prepared:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        if origin != "*":
            response.headers["Vary"] = "Origin"
    return response


def setup(app: web.Application, origins: tuple[str, ...], *, open_server: bool) -> None:
    app[ORIGINS_KEY] = tuple(origins)
    app[OPEN_SERVER_KEY] = open_server


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cors-origin", action="append", default=None, metavar="ORIGIN",
        help="browser origin allowed to call the API, e.g. https://app.example (repeatable; "
        "'*' allows any; default: any origin with --api-key, none without)",
    )


def origins_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.cors_origin or ())
