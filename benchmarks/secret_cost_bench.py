"""What rejecting an unknown `ek_` secret costs next to accepting a known one.

A real server on 127.0.0.1 holds N minted secrets (spread over 10 keys); the median HTTP
round trip of `GET /v1/models` is timed with a known secret (200) and an unknown one (401).
Usage: `python benchmarks/secret_cost_bench.py [N]` (docs/security.md has the figures).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import aiohttp
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.auth import AuthSettings

KEYS = tuple(f"sk-bench-{i}" for i in range(10))
REQUESTS = 400


async def median_round_trip(http: aiohttp.ClientSession, url: str,
                            token: str) -> tuple[float, int]:
    samples, status = [], 0
    for _ in range(REQUESTS):
        started = time.perf_counter()
        async with http.get(url + "/v1/models",
                            headers={"Authorization": f"Bearer {token}"}) as response:
            await response.read()
            status = response.status
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6, status


async def main(stored: int) -> None:
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    auth = AuthSettings(api_keys=KEYS, secret_ttl_seconds=3600, max_secrets_per_key=stored)
    server = TestServer(create_app(agent, auth=auth), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        async with aiohttp.ClientSession() as http:
            values = []
            for index in range(stored):
                key = KEYS[index % len(KEYS)]
                async with http.post(url + "/v1/realtime/client_secrets", json={},
                                     headers={"Authorization": f"Bearer {key}"}) as response:
                    values.append((await response.json())["value"])
            for _ in range(2):  # the first round warms up
                known = await median_round_trip(http, url, values[0])
                unknown = await median_round_trip(http, url, "ek_" + "A" * 32)
    finally:
        await server.close()
    print(f"stored={len(values)}  known {known[0]:.0f} us (HTTP {known[1]})  "
          f"unknown {unknown[0]:.0f} us (HTTP {unknown[1]})  "
          f"ratio {unknown[0] / known[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
