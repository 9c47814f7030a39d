"""Outbound SIP set-up time: `POST /v1/sip/calls` → answered, against sipp's built-in `uas`.

Calls are placed one after another (POST, GET until answered, DELETE, GET until ended) on
loopback with the echo plugin; sipp answers 180 + 200 and takes the BYE. Prints one table:
INVITE→answered as the agent records it (`answered_at - created_at`), the same as an
HTTP client polling GET sees it, and sipp's exit status (0: every call completed).

    python benchmarks/sip_outbound_bench.py [--calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import shutil
import socket
import statistics
import tempfile
import time

import aiohttp
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.sip.config import SipConfig
from signaling.sip.service import install

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def status_of(http: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with http.get(url) as response:
        return dict(await response.json())


async def run(calls: int) -> None:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is missing (apt-get install sip-tester)")
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    app = create_app(agent)
    install(app, SipConfig(listen_port=0))
    server = TestServer(app, host=HOST)
    await server.start_server()
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        far_end = await asyncio.create_subprocess_exec(
            sipp, "-sn", "uas", "-i", HOST, "-p", str(port), "-m", str(calls), "-nostdin",
            "-timeout", str(10 + calls), stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, cwd=workdir)
        try:
            while not taken(port):
                await asyncio.sleep(0.02)
            base = str(server.make_url("")).rstrip("/")
            recorded: list[float] = []
            polled: list[float] = []
            async with aiohttp.ClientSession() as http:
                for number in range(calls):
                    started = time.perf_counter()
                    async with http.post(f"{base}/v1/sip/calls",
                                         json={"to": f"sip:{number}@{HOST}:{port}"}) as reply:
                        call = dict(await reply.json())
                    url = f"{base}/v1/sip/calls/{call['id']}"
                    while call["status"] not in ("answered", "ended"):
                        await asyncio.sleep(0.002)
                        call = await status_of(http, url)
                    polled.append((time.perf_counter() - started) * 1000)
                    if call["status"] != "answered":
                        raise SystemExit(f"call {number} was not answered: {call}")
                    answered, created = call["answered_at"], call["created_at"]
                    assert isinstance(answered, float) and isinstance(created, float)
                    recorded.append((answered - created) * 1000)
                    async with http.delete(url) as reply:
                        await reply.read()
                    while (await status_of(http, url))["status"] != "ended":
                        await asyncio.sleep(0.002)
            code = await asyncio.wait_for(far_end.wait(), 30)
        finally:
            if far_end.returncode is None:
                far_end.kill()
                await far_end.wait()
            await server.close()
    print("| calls | INVITE→answered p50 (ms) | p95 | POST→answered seen by GET p50 (ms) "
          "| p95 | sipp exit |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| {calls} | {statistics.median(recorded):.1f} | {quantile(recorded, 0.95):.1f} "
          f"| {statistics.median(polled):.1f} | {quantile(polled, 0.95):.1f} | {code} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    asyncio.run(run(parser.parse_args().calls))


if __name__ == "__main__":
    main()
