"""The aiohttp application: routes, JSON errors, static page, agent lifetime."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from agent.errors import AgentError
from agent.logs.log_safe import printable
from agent.media_agent import MediaAgent
from signaling import (
    api,
    call_limit,
    calls,
    drain,
    health,
    metrics,
    offer,
    page,
    slow_clients,
    telephony,
)
from signaling.auth import AuthSettings
from signaling.errors import error_response, json_error
from signaling.keys import AGENT_KEY
from signaling.workers import handoff, relay, routing

log = logging.getLogger(__name__)

WEB_DIR: Path = page.web_dir()
MAX_BODY_BYTES = 256 * 1024
CLIENT_GONE = 499

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AgentError as exc:
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge:
        return json_error(413, "body_too_large",
                          f"request bodies are limited to {MAX_BODY_BYTES} bytes")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status, "http_error")
        return json_error(exc.status, code, exc.reason, headers=_allow_header(exc))
    except ConnectionResetError:
        # The caller hung up before the answer (a websocket upgrade it gave up on): nothing
        # can reach it, and nothing here failed. 499 is what access logs call that.
        log.info("%s %s: the client hung up before the answer", printable(request.method),
                 printable(request.path))
        return web.Response(status=CLIENT_GONE)
    except Exception:
        log.exception("unhandled error on %s %s", printable(request.method),
                      printable(request.path))
        return json_error(500, "internal_error", "the server failed to handle the request")


def _allow_header(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None


def create_app(
    agent: MediaAgent, *, max_body_bytes: int = MAX_BODY_BYTES,
    auth: AuthSettings | None = None, cors_origins: tuple[str, ...] = (),
    telephony_config: telephony.TelephonyConfig | None = None,
    body_timeout: float = slow_clients.DEFAULT_BODY_TIMEOUT,
    drain_seconds: float = drain.DEFAULT_DRAIN_SECONDS,
    metrics_enabled: bool = True,
    voice_upload_bytes: int = 0,
    workers: routing.WorkerGroup | None = None,
    token_url_origins: tuple[str, ...] = (),
) -> web.Application:
    app = web.Application(middlewares=[error_middleware, slow_clients.body_timeout_middleware],
                          client_max_size=max_body_bytes)
    app[AGENT_KEY] = agent
    app[calls.VOICE_UPLOAD_BYTES_KEY] = max(0, voice_upload_bytes)
    slow_clients.setup(app, body_timeout)
    api.install(app, auth_settings=auth, cors_origins=cors_origins)
    offer.add_routes(app)
    health.add_routes(app)
    if metrics_enabled:
        metrics.add_routes(app)
        call_limit.install_pending_metrics(app)
    else:
        agent.stop_timing_metrics()
    drain.setup(app, drain_seconds)
    telephony.add_routes(app, telephony_config)
    page.setup(app, WEB_DIR / "index.html", token_url_origins)  # ValueError: a bad origin
    if WEB_DIR.is_dir():
        app.router.add_static("/static/", WEB_DIR, show_index=False)

    async def on_startup(app: web.Application) -> None:
        await agent.start()

    async def on_shutdown(app: web.Application) -> None:
        await agent.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    if workers is not None and workers.count > 1:
        routing.install(app, workers)
        relay.install(app)
        handoff.install(app)
    return app
