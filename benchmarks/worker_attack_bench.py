"""The worker layer under attack, in figures: `python benchmarks/worker_attack_bench.py`.

A server with 2 workers and two tenants' keys, on loopback. Prints one table:
- a tenant's control request (GET of its own RTP leg through the public port): latency
  quiet, and while attackers flood the forwarding path with random methods, framing headers,
  bodies, pipelined requests and forged worker marks, plus the wrong answers it got (a
  refusal, another leg, or later than 2 s);
- the connections one address keeps open after an unauthenticated media-stream upgrade
  flood (with `--max-unauthenticated-per-address`), and the workers' file descriptors;
- what one forwarded request costs: the inter-worker signature (sign + verify, in-process)
  and a leg read through the worker that holds it against one forwarded to the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
from harness import ROOT, agent_command, descendants, free_port, wait_for_port

from agent.worker_tag import ID_TOKEN_CHARS, worker_of

VICTIM, OTHER = "sk-bench-victim", "sk-bench-other"
RTP = "/v1/telephony/rtp"
SLOW_S = 2.0
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "BREW"]
FRAMING = ["", "Content-Length: 0", "Content-Length: 2", "Content-Length: 99999999",
           "Content-Length: 5\r\nContent-Length: 7", "Transfer-Encoding: chunked",
           "Transfer-Encoding: chunked\r\nContent-Length: 4", "Expect: 100-continue",
           "X-Agent-Worker-Forwarded: 1", "Connection: keep-alive"]
BODIES = [b"", b"{}", b"0\r\n\r\n", b'{"remote": "127.0.0.1:9"}',
          b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n"]


def head(method: str, path: str, *lines: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: agent\r\n" + "".join(f"{line}\r\n" for line in lines
                                                                     if line) + "\r\n").encode()


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (f"p50 {1000 * statistics.median(ordered):.1f} ms, p99 {1000 * p99:.1f} ms, "
            f"max {1000 * ordered[-1]:.1f} ms")


async def make_leg(folder: Path, worker: int) -> str:
    connector = aiohttp.UnixConnector(path=str(folder / f"worker-{worker}.sock"))
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(20):
            async with http.post("http://worker" + RTP, json={"remote": "127.0.0.1:9"},
                                 headers={"Authorization": f"Bearer {VICTIM}"}) as response:
                call_id = (await response.json())["call_id"]
            if worker_of(call_id, ID_TOKEN_CHARS) == worker:
                return str(call_id)
    raise RuntimeError(f"no leg on worker {worker:d}")


async def victim(url: str, legs: list[str], until: float, latencies: list[float],
                 wrong: list[object]) -> None:
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < until:
            for leg in legs:
                started = time.monotonic()
                try:
                    async with http.get(f"{url}{RTP}/{leg}",
                                        headers={"Authorization": f"Bearer {VICTIM}"},
                                        timeout=aiohttp.ClientTimeout(total=SLOW_S)) as response:
                        body = await response.json()
                        ok = response.status == 200 and body.get("call_id") == leg
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    body, ok = {"error": repr(exc)}, False
                took = time.monotonic() - started
                latencies.append(took)
                if not ok or took >= SLOW_S:
                    wrong.append((leg, body, took))


async def attacker(port: int, paths: list[str], until: float, seed: int, sent: list[int]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        data = b"".join(head(rng.choice(METHODS), rng.choice(paths),
                             *(rng.choice(FRAMING) for _ in range(rng.randint(0, 2))))
                        + rng.choice(BODIES) for _ in range(rng.randint(1, 3)))
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(data)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(reader.read(65536), 0.1)
            writer.close()
            sent[0] += 1
        except OSError:
            pass


async def control_latency(url: str, port: int, legs: list[str], seconds: float,
                          attackers: int) -> tuple[list[float], list[object], int]:
    latencies: list[float] = []
    wrong: list[object] = []
    sent = [0]
    until = time.monotonic() + seconds
    paths = ["/health", "/metrics", "/metrics/calls", "/admin/drain", RTP, "/offer",
             *(f"{RTP}/{leg}" for leg in legs)]
    await asyncio.gather(victim(url, legs, until, latencies, wrong),
                         *(attacker(port, paths, until, seed, sent) for seed in range(attackers)))
    return latencies, wrong, sent[0]


def open_count(sockets: list[socket.socket]) -> int:
    alive = 0
    for sock in sockets:
        try:
            if sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):  # b"": closed
                alive += 1
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


def fd_count(pids: list[int]) -> int:
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids if os.path.exists(f"/proc/{pid}"))


async def upgrade_flood(port: int, count: int, worker_pids: list[int]) -> tuple[int, int, int]:
    before = fd_count(worker_pids)
    upgrade = head("GET", "/v1/telephony/media-stream", "Upgrade: websocket", "Connection: Upgrade",
                   "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
    loop = asyncio.get_running_loop()
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await loop.sock_sendall(sock, upgrade)
        except OSError:
            pass
        sockets.append(sock)
    await asyncio.sleep(2.0)
    held, during = open_count(sockets), fd_count(worker_pids)
    for sock in sockets:
        sock.close()
    return held, before, during


def signature_cost(rounds: int = 20000) -> float:
    """Microseconds to sign one forwarded request and verify it (the same HMAC twice)."""
    from signaling.workers.channel import Channel
    channel = Channel(0, Path("/nonexistent"), os.urandom(32))
    path = "/v1/telephony/rtp/rtp_1" + "x" * (ID_TOKEN_CHARS - 1)
    started = time.perf_counter()
    for _ in range(rounds):
        headers = channel.sign("GET", path, 0)
        stamp = headers["X-Agent-Worker-Signature"].split(",")[0][2:]
        channel.signature(0, stamp, "GET", path, 0)
    return (time.perf_counter() - started) / rounds * 1e6


async def local_vs_forwarded(folder: Path, legs: list[str], rounds: int) -> tuple[float, float]:
    connector = aiohttp.UnixConnector(path=str(folder / "worker-0.sock"))
    times: dict[str, list[float]] = {leg: [] for leg in legs}
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(rounds):
            for leg in legs:
                started = time.perf_counter()
                async with http.get(f"http://worker{RTP}/{leg}",
                                    headers={"Authorization": f"Bearer {VICTIM}"}) as response:
                    await response.read()
                times[leg].append(time.perf_counter() - started)
    return statistics.median(times[legs[0]]), statistics.median(times[legs[1]])


async def run(args: argparse.Namespace) -> None:
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="attack-bench-")) / "w"
    command = agent_command(port, "--api-key", VICTIM, "--api-key", OTHER,
                            "--max-unauthenticated-per-address", str(args.per_address),
                            "--worker-dir", str(folder), workers=2)
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        deadline = time.monotonic() + 60
        while not all((folder / f"worker-{i}.sock").exists() for i in (0, 1)):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)
        url = f"http://127.0.0.1:{port}"
        legs = [await make_leg(folder, 0), await make_leg(folder, 1)]
        worker_pids = descendants(server.pid)
        quiet, quiet_wrong, _ = await control_latency(url, port, legs, args.seconds, 0)
        flooded, flood_wrong, attacks = await control_latency(url, port, legs, args.seconds,
                                                              args.attackers)
        local, forwarded = await local_vs_forwarded(folder, legs, 200)
        held, fds_before, fds_during = await upgrade_flood(port, args.upgrades, worker_pids)
        try:
            sign_us = signature_cost()
        except ImportError:  # a server from before the channel was signed
            sign_us = float("nan")
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"2 workers, echo, loopback, {os.cpu_count()} cores; {args.seconds:g} s per phase")
    print("| measure | figure |")
    print("|---|---|")
    print(f"| tenant control request, quiet ({len(quiet)}) | {percentiles(quiet)}; "
          f"wrong answers {len(quiet_wrong)} |")
    print(f"| tenant control request, {args.attackers} attackers flooding the forwarding path "
          f"({attacks} attack connections, {len(flooded)} requests) | {percentiles(flooded)}; "
          f"**wrong answers {len(flood_wrong)}** |")
    print(f"| {args.upgrades} unauthenticated upgrades from one address, limit "
          f"{args.per_address} | **{held} left open**; workers' fds {fds_before} -> "
          f"{fds_during} |")
    print(f"| inter-worker signature, sign + verify | {sign_us:.1f} us per forwarded request |")
    print(f"| leg read on the accepting worker vs forwarded (median of 200) | "
          f"{1000 * local:.2f} ms vs {1000 * forwarded:.2f} ms (+{1000 * (forwarded - local):.2f} "
          "ms: a unix connection of its own, the signature, the owner's handling) |")
    for item in flood_wrong[:5]:
        print("wrong:", item)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--upgrades", type=int, default=900)
    parser.add_argument("--per-address", type=int, default=128)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
