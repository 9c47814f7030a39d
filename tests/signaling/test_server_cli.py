"""`python -m signaling` as a real process: auth from the environment, the start-up notice."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from tests.support.realtime import CALLS, offer_sdp_once


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def server_process(*args: str, env: dict[str, str]) -> AsyncIterator[tuple[str, list[str]]]:
    port = free_tcp_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--port", str(port), "--ice-host", "127.0.0.1",
        *args, env={**os.environ, **env}, stderr=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None

        async def until_serving() -> None:
            while True:
                line = (await process.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"server exited: {''.join(lines)}")
                lines.append(line)
                if "serving plugin" in line:
                    return
        await asyncio.wait_for(until_serving(), 60)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for _ in range(100):
                try:
                    async with http.get(url + "/health"):
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
        yield url, lines
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)


async def test_key_from_environment_and_open_server_notice() -> None:
    sdp = await offer_sdp_once()
    async with server_process(env={"AGENT_API_KEY": "sk-env-key"}) as (url, lines):
        assert any("API key required" in line for line in lines), lines
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/v1/models") as response:
                assert response.status == 401
            async with http.get(url + "/v1/models",
                                headers={"Authorization": "Bearer sk-env-key"}) as response:
                assert response.status == 200
    async with server_process(env={"AGENT_API_KEY": ""}) as (url, lines):
        assert any("no --api-key" in line and "loopback" in line for line in lines), lines
        async with aiohttp.ClientSession() as http:
            async with http.post(url + CALLS, data=sdp,
                                 headers={"Content-Type": "application/sdp"}) as response:
                assert response.status == 201
                location = response.headers["Location"]
            async with http.delete(url + location) as response:
                assert response.status == 200
