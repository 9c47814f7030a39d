"""signaling/aiohttp_internals.py: the aiohttp internals signaling uses, checked at start-up."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from signaling.aiohttp_internals import missing_internals

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_aiohttp_has_every_internal() -> None:
    assert missing_internals() == []


def test_a_class_without_them_is_named() -> None:
    class Handler:
        __slots__ = ("_request_count",)

    class Request:
        def __init__(self) -> None:
            self._cache: dict[str, object] = {}

    assert missing_internals(Handler, Request) == ["Request._payload"]
    assert missing_internals(Request, Handler) == [
        "Request._request_count", "Handler._payload", "Handler._cache"]


# An aiohttp whose requests no longer keep their body stream in `_payload`: the request class
# replaced by one without it before signaling is imported.
WITHOUT_PAYLOAD = """
import sys
from aiohttp import web

class BaseRequest:
    def __init__(self):
        self._cache = {}

web.BaseRequest = BaseRequest
from signaling.__main__ import main
sys.exit(main(["--port", "0"]))
"""


async def test_the_server_refuses_to_start_on_an_aiohttp_without_them() -> None:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WITHOUT_PAYLOAD, cwd=str(ROOT),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(server.communicate(), 120)
    finally:
        if server.returncode is None:
            server.kill()
            await server.wait()
    errors = [line for line in err.decode().splitlines() if line.startswith("error [")]
    assert server.returncode == 2, err.decode()
    assert len(errors) == 1, err.decode()
    assert errors[0].startswith("error [aiohttp_unsupported]:")
    assert "BaseRequest._payload" in errors[0]
