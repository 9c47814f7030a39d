"""JSON error responses: every refusal names a machine-readable `code`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agent.errors import AgentError
from agent.realtime import client_json


def json_error(
    status: int, code: str, message: str, *, param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if param is not None:
        error["param"] = param
    return web.json_response({"error": error}, status=status, headers=headers)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; a coded `ApiError` (415 wrong type, 400 not a JSON
    object) otherwise, and aiohttp's 413 past the body limit."""
    if request.content_type != "application/json":
        # text/plain and forms are CORS "simple requests" a foreign page can send without
        # a preflight; refusing them keeps JSON routes out of reach of such pages.
        raise ApiError("unsupported_media_type", "send the body as application/json", status=415)
    try:
        body = client_json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge:
        raise
    except client_json.ClientJsonError as exc:
        raise ApiError("invalid_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("invalid_json", "the request body must be a JSON object")
    return body


class ApiError(AgentError):
    """A refusal made by the HTTP layer itself (auth, limits, routing)."""


def error_response(exc: AgentError) -> web.Response:
    """Every coded error as HTTP: the JSON body, and `Retry-After` on 503."""
    headers = exc.headers
    if exc.status == 503:
        headers = {"Retry-After": "5", **(headers or {})}
    return json_error(exc.status, exc.code, exc.message, param=exc.param, headers=headers)
