"""The server process: keys in request lines never reach its log (stderr), however the
path is spelled."""

from __future__ import annotations

import asyncio

import aiohttp
from yarl import URL

from tests.support.server_process import read_until, running_server

KEY = "sk-process-secret-1"


async def test_request_lines_are_logged_without_keys() -> None:
    async with running_server("--api-key", KEY) as (server, url, lines):
        assert server.stderr is not None
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


async def test_a_percent_encoded_media_stream_path_is_refused_and_its_key_not_logged() -> None:
    async with running_server("--api-key", KEY) as (server, url, lines):
        assert server.stderr is not None
        async with aiohttp.ClientSession() as http:
            for route in ("/v1/telephony/media%2Dstream", "/v1/telephony/%6D%65dia-stream"):
                async with http.get(URL(f"{url}{route}/{KEY}", encoded=True)) as response:
                    assert response.status == 400
                    assert (await response.json())["error"]["code"] == "non_canonical_path"
            async with http.get(url + "/health?last=2") as response:
                await response.read()
        await asyncio.wait_for(read_until(server.stderr, "/health?last=2", lines), 20)
        log = "".join(lines)
        assert log.count("/v1/telephony/media-stream/***") == 2
        assert KEY not in log
