"""Wires the OpenAI-Realtime / WHIP-style API into an app: CORS, auth, routes.

Routes (all errors are JSON `{"error": {"code", "message", "param"?}}`):
- `POST /v1/realtime/calls`: `application/sdp` offer, or `multipart/form-data` with `sdp` and
  `session` (JSON, OpenAI shape: `instructions`, `audio.output.voice`, plus `extra_body`).
  201 + SDP answer, `Location: /v1/realtime/calls/{call_id}`, `ETag`, one `Link` per ICE
  server. 415 wrong type, 400 bad SDP/session (plugin codes), 413 body limits, 411 multipart
  without Content-Length, 503 + `Retry-After` (`server_full`) when `--max-sessions` is reached.
- `GET /v1/realtime/calls/{id}`: 200 JSON, the call's session and live stats, with `ETag`.
- `DELETE /v1/realtime/calls/{id}` and `POST /v1/realtime/calls/{id}/hangup`: 200; 404
  (`call_not_found`) for an unknown id or another credential's call.
- `PATCH /v1/realtime/calls/{id}` (`application/trickle-ice-sdpfrag`): 204; 412 wrong
  `If-Match`; 422 ICE restart; 400 bad fragment/candidate/mid.
- `OPTIONS` on any route: CORS preflight, `Accept-Post` on the calls collection.
- `GET /v1/realtime?call_id=ID` (websocket): the call's sideband, for any transport; see
  `sideband`.
- `POST /v1/realtime/client_secrets`: see `auth`.
- `GET /v1/realtime/config`: ICE servers (browser shape), plugin, codecs, voices.
- `GET /v1/models`, `GET /v1/models/{id}`: the served plugin in the OpenAI list shape, voices.
"""

from __future__ import annotations

from aiohttp import web

from signaling import auth, calls, cors, ice, models, sideband
from signaling.auth import AuthSettings


def install(app: web.Application, *, auth_settings: AuthSettings | None = None,
            cors_origins: tuple[str, ...] = ()) -> None:
    # Outside the error and auth middlewares, so even their refusals carry CORS headers.
    app.middlewares.insert(0, cors.cors_middleware)
    app.middlewares.append(auth.auth_middleware)
    auth_settings = auth_settings or AuthSettings()
    cors.setup(app, cors_origins, open_server=auth_settings.open)
    auth.setup(app, auth_settings)
    calls.add_routes(app)
    sideband.add_routes(app)
    ice.add_routes(app)
    models.add_routes(app)
