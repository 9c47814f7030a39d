"""The server process: keys in request lines never reach its log (stderr)."""

from __future__ import annotations

import asyncio
import sys

import aiohttp

from test_cli_lifecycle import free_tcp_port, read_until

KEY = "sk-process-secret-1"


async def test_request_lines_are_logged_without_keys() -> None:
    port = free_tcp_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--port", str(port), "--api-key", KEY,
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )
    lines: list[str] = []
    assert server.stderr is not None
    try:
        await asyncio.wait_for(read_until(server.stderr, "serving plugin echo", lines), 60)
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            for path in (f"/v1/telephony/media-stream?token={KEY}",
                         f"/v1/telephony/media-stream/{KEY}",
                         f"/v1/models?api_key={KEY}&password=hunter2"):
                async with http.get(url + path) as response:
                    await response.read()
            async with http.get(url + "/health?last=1") as response:
                await response.read()
        # The access log line of the last request marks that the others were written.
        await asyncio.wait_for(read_until(server.stderr, "/health?last=1", lines), 20)
        log = "".join(lines)
        assert "/v1/telephony/media-stream/***" in log and "token=***" in log
        assert KEY not in log and "hunter2" not in log
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 30)
