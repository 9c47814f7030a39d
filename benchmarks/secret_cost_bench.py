"""Median HTTP round trip for authenticating a known vs an unknown ek_ secret on a real
server with N stored secrets: `python benchmarks/secret_cost_bench.py N` (docs/security.md)."""
import asyncio, statistics, sys, time, aiohttp
from aiohttp.test_utils import TestServer
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.auth import AuthSettings

KEYS = tuple(f"sk-{i}" for i in range(10))

async def main(stored: int) -> None:
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    server = TestServer(create_app(agent, auth=AuthSettings(api_keys=KEYS, secret_ttl_seconds=3600)), host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as http:
        async def mint(key):
            async with http.post(url + "/v1/realtime/client_secrets", json={}, headers={"Authorization": f"Bearer {key}"}) as r:
                return (await r.json())["value"] if r.status == 200 else None
        values = []
        for i in range(stored):
            v = await mint(KEYS[i % len(KEYS)])
            if v: values.append(v)
        known = values[0]
        unknown = "ek_" + "A" * 32
        async def timed(token, n=400):
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                async with http.get(url + "/v1/models", headers={"Authorization": f"Bearer {token}"}) as r:
                    await r.read()
                samples.append(time.perf_counter() - t)
            return statistics.median(samples) * 1e6, r.status
        for _ in range(2):
            k = await timed(known); u = await timed(unknown)
        print(f"stored={len(values)} known {k[0]:.0f} us (HTTP {k[1]})  unknown {u[0]:.0f} us (HTTP {u[1]})  ratio {u[0]/k[0]:.2f}")
    await server.close()

asyncio.run(main(int(sys.argv[1])))
