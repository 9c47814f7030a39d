"""JSON error responses: every refusal names a machine-readable `code`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

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
    try:
        body = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise
    except Exception:
        raise ApiError(400, "invalid_json", "the request body is not valid JSON") from None
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
