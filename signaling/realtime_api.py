"""Wires the OpenAI-Realtime / WHIP-style API into an app: CORS, auth, routes."""

from __future__ import annotations

from aiohttp import web

from . import auth, cors, ice, models, realtime
from .auth import AuthSettings


def install(app: web.Application, *, auth_settings: AuthSettings | None = None,
            cors_origins: tuple[str, ...] = ()) -> None:
    # Outermost, so even refusals from the error middleware carry CORS headers.
    app.middlewares.insert(0, cors.cors_middleware)
    app.middlewares.append(auth.auth_middleware)
    cors.setup(app, cors_origins)
    auth.setup(app, auth_settings or AuthSettings())
    realtime.add_routes(app)
    ice.add_routes(app)
    models.add_routes(app)
