"""Cluster mode (`--cluster`) on one machine: redis-server and three nodes on 127.0.0.2-4.

Sections (all by default):
- `latency`: a call's GET answered by its owner directly, and through another node (one
  signed hop): p50/p95 of each and what the hop adds;
- `setup`: Redis round trips per call set-up (placement, settling) on the request path,
  and the registry's round trips per call over the same run;
- `counts`: the issue's full counts: capacity 3 x 8 with a burst of 40 new calls, 100
  secrets minted at one node and redeemed at another (each reuse 401), 200 redemption races
  between two nodes, `--max-calls-per-key 5` against a burst of 20;
- `sideband`: a call's sideband websocket (`GET /v1/realtime?call_id=ID`) opened at its
  owner and at another node (relayed, one signed hop): p50/p95 of open-to-`session.created`
  and of a `session.update` -> `session.updated` round trip;
- `lag`: p99 event-loop lag of one node holding N plain RTP legs (20 ms sends each), with
  and without `--cluster`.

    python benchmarks/cluster_bench.py [--sections latency,setup,sideband,counts,lag]
        [--calls 60]
        [--lag-calls 24] [--lag-seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection
from harness import ROOT, free_port, wait_for_port

SECRET = "cluster-bench-secret-0123456789"
KEY = "bench-key"
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


@contextmanager
def nodes(folder: Path, redis_url: str | None, count: int, *flags: str) -> Iterator[list[str]]:
    """`count` nodes (one worker each); with `redis_url` None, plain servers."""
    processes, urls = [], []
    try:
        for host in HOSTS[:count]:
            with socket_port(host) as port:
                cluster = [] if redis_url is None else [
                    "--cluster", redis_url, "--node-address", f"http://{host}:{port}"]
                log = open(folder / f"{host}.log", "wb")  # noqa: SIM115 (closed below)
                processes.append((subprocess.Popen(
                    [sys.executable, "-m", "signaling", "--host", host, "--port", str(port),
                     "--workers", "1", "--ice-host", host, "--log-level", "WARNING",
                     "--connect-timeout", "300", *cluster, *flags],
                    cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                    env={**os.environ, "AGENT_CLUSTER_SECRET": SECRET}), log))
                urls.append(f"http://{host}:{port}")
        for url in urls:
            wait_ready(url)
        yield urls
    finally:
        for process, log in processes:
            process.kill()
            process.wait()
            log.close()


@contextmanager
def socket_port(host: str) -> Iterator[int]:
    import socket
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    yield port


def wait_ready(url: str, timeout: float = 60) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready")


def auth(token: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def rtp(session: aiohttp.ClientSession, url: str, key: str = KEY
              ) -> tuple[int, dict[str, Any]]:
    async with session.post(url + "/v1/telephony/rtp", headers=auth(key),
                            json={"remote": "127.0.0.1:9", "codec": "PCMU"}) as response:
        return response.status, await response.json()


async def offer_sdp() -> str:
    pc = RTCPeerConnection()
    pc.createDataChannel("oai-events")
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return str(sdp)


async def offer(session: aiohttp.ClientSession, url: str, sdp: str, token: str
                ) -> tuple[int, str]:
    async with session.post(url + "/v1/realtime/calls", data=sdp,
                            headers={**auth(token), "Content-Type": "application/sdp"}) as r:
        await r.read()
        return r.status, r.headers.get("Location", "")


async def end(session: aiohttp.ClientSession, url: str, location: str) -> None:
    async with session.delete(url + location, headers=auth()) as response:
        await response.read()


def tag(call_id: str) -> str:
    return call_id[-24]


async def health(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/health") as response:
        return dict(await response.json())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(urls: list[str], calls: int) -> None:
    async with aiohttp.ClientSession() as session:
        tags = {(await health(session, url))["cluster"]["node"]: url for url in urls}
        made = [(await rtp(session, urls[i % 3]))[1]["call_id"] for i in range(calls)]
        direct, forwarded = [], []
        for _ in range(5):
            for call in made:
                owner = tags[tag(call)]
                other = next(url for url in urls if url != owner)
                for url, into in ((owner, direct), (other, forwarded)):
                    started = time.perf_counter()
                    async with session.get(f"{url}/v1/telephony/rtp/{call}",
                                           headers=auth()) as response:
                        await response.read()
                        assert response.status == 200
                    into.append((time.perf_counter() - started) * 1000)
        for call in made:
            await end(session, tags[tag(call)], f"/v1/telephony/rtp/{call}")
    print(f"\n### Forward latency ({calls} calls x 5 GETs each way)\n")
    print("| path | p50 ms | p95 ms |\n| --- | --- | --- |")
    print(f"| owner directly | {percentile(direct, .5):.2f} | {percentile(direct, .95):.2f} |")
    print(f"| through another node | {percentile(forwarded, .5):.2f} | "
          f"{percentile(forwarded, .95):.2f} |")
    added = [f - d for f, d in zip(forwarded, direct, strict=True)]
    print(f"| added by the hop | {percentile(added, .5):.2f} | {percentile(added, .95):.2f} |")


async def next_event(socket: aiohttp.ClientWebSocketResponse, kind: str) -> None:
    while True:
        message = await socket.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        if json.loads(message.data).get("type") == kind:
            return


async def sideband(urls: list[str], calls: int) -> None:
    async with aiohttp.ClientSession() as session:
        tags = {(await health(session, url))["cluster"]["node"]: url for url in urls}
        made = [(await rtp(session, urls[i % 3]))[1]["call_id"] for i in range(calls)]
        figures: dict[str, tuple[list[float], list[float]]] = {
            "owner directly": ([], []), "through another node": ([], [])}
        for call in made:
            owner = tags[tag(call)]
            other = next(url for url in urls if url != owner)
            for url, name in ((owner, "owner directly"), (other, "through another node")):
                opened, updated = figures[name]
                started = time.perf_counter()
                async with session.ws_connect(f"{url}/v1/realtime?call_id={call}",
                                              headers=auth()) as socket:
                    await next_event(socket, "session.created")
                    opened.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    await socket.send_json({"type": "session.update",
                                            "session": {"instructions": "Be brief."}})
                    await next_event(socket, "session.updated")
                    updated.append((time.perf_counter() - started) * 1000)
        for call in made:
            await end(session, tags[tag(call)], f"/v1/telephony/rtp/{call}")
    print(f"\n### Sideband websockets ({calls} calls, one each way)\n")
    print("| path | open p50 ms | open p95 ms | update round trip p50 ms | p95 ms |")
    print("| --- | --- | --- | --- | --- |")
    for name, (opened, updated) in figures.items():
        print(f"| {name} | {percentile(opened, .5):.2f} | {percentile(opened, .95):.2f} | "
              f"{percentile(updated, .5):.2f} | {percentile(updated, .95):.2f} |")


async def setup_cost(urls: list[str], calls: int) -> None:
    async with aiohttp.ClientSession() as session:
        async def totals() -> tuple[int, int]:
            views = [(await health(session, url))["cluster"] for url in urls]
            return (sum(v["redis_round_trips"] for v in views),
                    sum(v["registry_round_trips"] for v in views))
        before = await totals()
        made = []
        for i in range(calls):
            status, body = await rtp(session, urls[i % 3])
            assert status == 201, body
            made.append(body["call_id"])
        after = await totals()
        for call in made:
            await end(session, urls[0], f"/v1/telephony/rtp/{call}")
    request_path = (after[0] - before[0]) - (after[1] - before[1])
    print(f"\n### Redis round trips per call set-up ({calls} calls, one at a time)\n")
    print("| round trips | per call |\n| --- | --- |")
    print(f"| on the request path (placement, settling) | {request_path / calls:.2f} |")
    print(f"| registry syncs meanwhile (all nodes) | {(after[1] - before[1]) / calls:.2f} |")


async def counts(urls: list[str]) -> None:
    rows = []
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(rtp(session, urls[i % 3]) for i in range(40)))
        statuses = Counter(status for status, _ in answers)
        rows.append(("burst of 40 on 3 x 8", "24 admitted", f"{statuses[201]} admitted, "
                     f"{statuses[503]} server_full"))
        for _, body in answers:
            if "call_id" in body:
                await end(session, urls[0], f"/v1/telephony/rtp/{body['call_id']}")
        await asyncio.sleep(0.5)
        ok = reused = 0
        for batch in range(0, 100, 8):
            values = []
            for _ in range(min(8, 100 - batch)):
                async with session.post(urls[0] + "/v1/realtime/client_secrets",
                                        headers=auth(), json={}) as response:
                    values.append((await response.json())["value"])
            made = []
            for value in values:
                status, location = await offer(session, urls[1], await offer_sdp(), value)
                ok += status == 201
                made.append(location)
                again, _ = await offer(session, urls[2], await offer_sdp(), value)
                reused += again == 401
            for location in made:
                await end(session, urls[1], location)
        rows.append(("100 secrets minted at node 1, redeemed at node 2", "100 / 100 reuses 401",
                     f"{ok} / {reused}"))
        winners = Counter()
        for _ in range(0, 200, 4):
            values = []
            for _ in range(4):
                async with session.post(urls[2] + "/v1/realtime/client_secrets",
                                        headers=auth(), json={}) as response:
                    values.append((await response.json())["value"])
            sdps = [await offer_sdp() for _ in range(2 * len(values))]
            results = await asyncio.gather(*(offer(session, url, sdps[2 * i + j], value)
                                             for i, value in enumerate(values)
                                             for j, url in enumerate(urls[:2])))
            for i in range(4):
                winners[sum(status == 201 for status, _ in results[2 * i:2 * i + 2])] += 1
            for status, location in results:
                if status == 201:
                    await end(session, urls[0], location)
        rows.append(("200 races between two nodes", "200 with exactly one winner",
                     f"{winners[1]} one winner, {winners[0]} none, {winners[2]} two"))
    print("\n### The issue's counts\n")
    print("| case | expected | measured |\n| --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")


async def per_key(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(rtp(session, urls[i % 3]) for i in range(20)))
        statuses = Counter(status for status, _ in answers)
        for _, body in answers:
            if "call_id" in body:
                await end(session, urls[0], f"/v1/telephony/rtp/{body['call_id']}")
    print(f"| --max-calls-per-key 5, burst of 20 | 5 admitted | {statuses[201]} admitted, "
          f"{statuses[429]} tenant_limit |")


def lag_p99(text: str) -> float:
    buckets = []
    for line in text.splitlines():
        if line.startswith("agent_event_loop_lag_seconds_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0
    for bound, count in buckets:
        if total and count >= 0.99 * total:
            return bound
    return float("nan")


async def lag(url: str, calls: int, seconds: float) -> float:
    """p99 loop lag of the node while it holds `calls` RTP legs (the histogram is read once
    the legs ran for `seconds`: their samples dominate it)."""
    async with aiohttp.ClientSession() as session:
        made = [(await rtp(session, url))[1]["call_id"] for _ in range(calls)]
        await asyncio.sleep(seconds)
        async with session.get(url + "/metrics", headers=auth()) as response:
            text = await response.text()
        for call in made:
            await end(session, url, f"/v1/telephony/rtp/{call}")
    return lag_p99(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="latency,setup,sideband,counts,lag")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--lag-calls", type=int, default=24)
    parser.add_argument("--lag-seconds", type=float, default=10.0)
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    sections = set(args.sections.split(","))
    folder = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    common = ("--api-key", KEY, "--max-sessions", "0")
    with redis_server(folder) as redis_url:
        if sections & {"latency", "setup", "sideband"}:
            with nodes(folder, redis_url, 3, *common) as urls:
                if "latency" in sections:
                    asyncio.run(latency(urls, args.calls))
                if "setup" in sections:
                    asyncio.run(setup_cost(urls, args.calls))
                if "sideband" in sections:
                    asyncio.run(sideband(urls, args.calls))
        if "counts" in sections:
            with nodes(folder, redis_url, 3, "--api-key", KEY, "--max-sessions", "8",
                       "--max-secrets-per-key", "1000") as urls:
                asyncio.run(counts(urls))
            with nodes(folder, redis_url, 3, "--api-key", KEY, "--max-calls-per-key", "5",
                       ) as urls:
                asyncio.run(per_key(urls))
        if "lag" in sections:
            figures = {}
            for name, url in (("without --cluster", None), ("with --cluster", redis_url)):
                with nodes(folder, url, 1, *common) as urls:
                    figures[name] = asyncio.run(lag(urls[0], args.lag_calls,
                                                    args.lag_seconds))
            print(f"\n### Event-loop lag, one node holding {args.lag_calls} RTP legs for "
                  f"{args.lag_seconds:g} s\n")
            print("| server | p99 lag (histogram bucket bound, ms) |\n| --- | --- |")
            for name, value in figures.items():
                print(f"| {name} | {value * 1000:.1f} |")
    print(json.dumps({"folder": str(folder)}))


if __name__ == "__main__":
    main()
