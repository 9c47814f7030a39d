"""CORS for browsers on other origins, and `OPTIONS` answers with `Accept-Post` (RFC 9725).

Credentials travel as Bearer tokens, never cookies, so any origin may be allowed by default;
`--cors-origin` narrows it. Every response (errors included) exposes the headers a WHIP or
Realtime client reads: `Location`, `ETag`, `Link`, `Retry-After`.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from aiohttp import web

from .errors import json_error

ALLOW_HEADERS = "Authorization, Content-Type, If-Match"
EXPOSE_HEADERS = "Location, ETag, Link, Retry-After, Accept-Post"
ACCEPT_POST = "application/sdp, multipart/form-data"
PREFLIGHT_MAX_AGE = "600"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ORIGINS_KEY = web.AppKey("cors_origins", tuple)


def allowed_origin(request: web.Request) -> str | None:
    origins: tuple[str, ...] = request.app[ORIGINS_KEY]
    origin = request.headers.get("Origin")
    if not origins or "*" in origins:
        return "*"
    return origin if origin in origins else None


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
    origin = allowed_origin(request)
    if request.method == "OPTIONS":
        response: web.StreamResponse = preflight(request)
    else:
        response = await handler(request)
    if origin is not None and not response.prepared:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        if origin != "*":
            response.headers["Vary"] = "Origin"
    return response


def setup(app: web.Application, origins: tuple[str, ...]) -> None:
    app[ORIGINS_KEY] = tuple(origins)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cors-origin", action="append", default=None, metavar="ORIGIN",
        help="browser origin allowed to call the API (repeatable; default: any)",
    )


def origins_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    return tuple(args.cors_origin or ())
