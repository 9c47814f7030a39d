"""JSON error responses: every refusal names a machine-readable `code`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from agent import client_json
from agent.plugins.base import PluginError


def json_error(
    status: int, code: str, message: str, *, param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if param is not None:
        error["param"] = param
    return web.json_response({"error": error}, status=status, headers=headers)


def from_plugin_error(exc: PluginError, headers: dict[str, str] | None = None) -> web.Response:
    if exc.status == 503:
        headers = {"Retry-After": "5", **(headers or {})}
    return json_error(exc.status, exc.code, exc.message, param=exc.param, headers=headers)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a coded 4xx raised as web.HTTPException."""
    if request.content_type != "application/json":
        # text/plain and forms are CORS "simple requests" a foreign page can send without
        # a preflight; refusing them keeps JSON routes out of reach of such pages.
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    try:
        body = client_json.loads(await request.read())
    except web.HTTPRequestEntityTooLarge:
        raise
    except client_json.ClientJsonError as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    return body


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers

    def response(self) -> web.Response:
        return json_error(self.status, self.code, self.message, param=self.param,
                          headers=self.headers)
