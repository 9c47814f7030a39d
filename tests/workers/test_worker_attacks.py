"""The worker layer as an attacker meets it: 2 workers behind one port, a tenant as the victim.

Raw sockets write what no well-behaved client library would (a GET with a body, a false
Content-Length, pipelined requests, a forged worker mark); the victim's control requests
must keep getting their own answers, at once. A fuzz pass mixes random methods, framing
headers and bodies with a victim alongside and counts the wrong answers it got (0). Each
worker's private socket lets a test choose the worker an attack lands on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.worker_tag import ID_TOKEN_CHARS, worker_of
from tests.support.server_process import read_until

from .test_workers import Workers, two_workers, wait_for_async

VICTIM = "sk-victim-tenant"
OTHER = "sk-other-tenant"
RTP = "/v1/telephony/rtp"
KEYS = ("--api-key", VICTIM, "--api-key", OTHER)


@contextlib.asynccontextmanager
async def attacked(folder: Path, *flags: str) -> AsyncIterator[tuple[Workers, list[str]]]:
    """Two workers with two tenants' keys; every log line the server writes is kept."""
    async with two_workers(folder, *KEYS, *flags) as group:
        assert group.process.stderr is not None
        lines: list[str] = []
        reader = asyncio.ensure_future(read_until(group.process.stderr, "\0never", lines))
        try:
            yield group, lines
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def leg_on(group: Workers, worker: int, key: str = VICTIM) -> str:
    """An RTP leg of `key`'s made on `worker` (asked there, each worker lighter in turn)."""
    for _ in range(20):
        async with group.via(worker).post("http://worker" + RTP, headers=auth(key),
                                          json={"remote": "127.0.0.1:9"}) as response:
            body = await response.json()
            assert response.status == 201, body
        if worker_of(body["call_id"], ID_TOKEN_CHARS) == worker:
            return str(body["call_id"])
        # placed on the lighter worker: keep it (it evens the load) and ask again
    raise AssertionError(f"no leg landed on worker {worker}")


def worker_port(group: Workers) -> int:
    return int(group.url.rsplit(":", 1)[1])


async def raw(address: str | tuple[str, int], data: bytes, wait: float = 0.5,
              until: bytes | None = None) -> bytes:
    """Send `data` on a new connection (a unix socket path or host:port) and return what
    came back within `wait` seconds, or once it holds `until` (the connection is then
    closed)."""
    if isinstance(address, str):
        reader, writer = await asyncio.open_unix_connection(address)
    else:
        reader, writer = await asyncio.open_connection(*address)
    got = b""
    try:
        writer.write(data)
        await writer.drain()
        deadline = asyncio.get_running_loop().time() + wait
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except asyncio.TimeoutError:
                break
            if not chunk:
                break
            got += chunk
            if until is not None and until in got:
                break
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    return got


async def victim_reads(group: Workers, call_id: str, via: int | None = None
                       ) -> tuple[int, Any, float]:
    """The victim's GET of its own leg: (status, body, seconds)."""
    started = time.monotonic()
    session = group.via(via) if via is not None else None
    url = ("http://worker" if via is not None else group.url) + f"{RTP}/{call_id}"
    if session is None:
        async with aiohttp.ClientSession() as http:
            async with http.get(url, headers=auth(VICTIM)) as response:
                return response.status, await response.json(), time.monotonic() - started
    async with session.get(url, headers=auth(VICTIM)) as response:
        return response.status, await response.json(), time.monotonic() - started


def leaks(got: bytes, legs: list[str]) -> bool:
    """The answer carries one of these legs' stats."""
    return any(f'"call_id": "{leg}"'.encode() in got for leg in legs)


def head(method: str, path: str, *headers: str) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: agent\r\n" + "".join(h + "\r\n" for h in headers)
            + "\r\n").encode()


async def test_a_false_content_length_on_a_fanned_out_view_stalls_no_other_request(
        tmp_path: Path) -> None:
    """An unauthenticated GET /health declaring 100 MB and sending none, through worker 0:
    the victim's request for its leg on worker 1, through worker 0 as well, is answered at
    once and correctly (before: 16 s, then 404 'its worker is not running')."""
    async with attacked(tmp_path / "w") as (group, _):
        victim = await leg_on(group, 1)
        entry = str(group.folder / "worker-0.sock")
        reader, writer = await asyncio.open_unix_connection(entry)
        writer.write(head("GET", "/health", "Content-Length: 100000000"))
        await writer.drain()
        try:
            await asyncio.sleep(0.3)
            for _ in range(3):
                status, body, seconds = await victim_reads(group, victim, via=0)
                assert status == 200 and body["call_id"] == victim, body
                assert seconds < 3.0, seconds
        finally:
            writer.close()


@pytest.mark.slow
async def test_a_get_with_a_body_and_pipelined_requests_keep_every_answer_in_place(
        tmp_path: Path) -> None:
    """GET /metrics/calls with a `{}` body, then pipelined requests naming the victim's legs,
    with no key, and a GET /health whose Content-Length swallows the head of the request
    after it: every answer the attacker gets is a refusal, none carries the victim's leg,
    and the victim's own requests stay right; no traceback in the log."""
    async with attacked(tmp_path / "w") as (group, lines):
        legs = [await leg_on(group, 0), await leg_on(group, 1)]
        body_on_get = (head("GET", "/metrics/calls", "Content-Length: 2",
                            "Content-Type: application/json") + b"{}"
                       + b"".join(head("GET", f"{RTP}/{leg}") for leg in legs))
        smuggle = (head("GET", "/health", f"Content-Length: {len(head('PATCH', '/x'))}")
                   + head("PATCH", f"{RTP}/{legs[1]}", "X-Agent-Worker-Forwarded: 0")
                   + head("GET", f"{RTP}/{legs[0]}"))
        for entry in (str(group.folder / "worker-0.sock"), ("127.0.0.1", worker_port(group))):
            for attack in (body_on_get, smuggle) * 3:
                got = await raw(entry, attack, wait=0.6)
                statuses = [line.split()[1] for line in got.split(b"\r\n")
                            if line.startswith(b"HTTP/1.")]
                assert statuses and all(status[:1] in (b"2", b"4") for status in statuses), got
                assert not leaks(got, legs), got
                for leg in legs:
                    status, body, _ = await victim_reads(group, leg)
                    assert status == 200 and body["call_id"] == leg, body
            got = await raw(entry, body_on_get, wait=0.6)
            assert got.count(b"HTTP/1.1 401") == 3, got  # each pipelined request answered
        assert not [line for line in lines if "Traceback" in line or " ERROR " in line], lines


async def test_a_forged_worker_mark_counts_for_nothing_even_on_a_workers_socket(
        tmp_path: Path) -> None:
    """A request on worker 1's private socket carrying the workers' mark (and a made-up
    signature) is routed like any client's: the victim's leg on worker 0 is forwarded there
    and found (a request taken as a worker's would be answered by worker 1 itself: 404)."""
    from signaling.workers.channel import FORWARDED_HEADER, SIGNATURE_HEADER
    async with attacked(tmp_path / "w") as (group, _):
        victim = await leg_on(group, 0)
        stamp = f"{time.time():.3f}"
        for headers in ({FORWARDED_HEADER: "0"},
                        {FORWARDED_HEADER: "0", SIGNATURE_HEADER: f"t={stamp},mac={'0' * 64}"}):
            async with group.via(1).get(f"http://worker{RTP}/{victim}",
                                        headers={**auth(VICTIM), **headers}) as response:
                body = await response.json()
                assert response.status == 200 and body["call_id"] == victim, body
            async with group.via(1).get(f"http://worker{RTP}/{victim}",
                                        headers=headers) as response:
                assert response.status == 401  # and no key is no key, mark or not


async def test_a_tenant_key_cannot_drain_the_workers(tmp_path: Path) -> None:
    async with attacked(tmp_path / "w", "--admin-key", "sk-operator") as (group, _):
        await leg_on(group, 0)  # live calls hold the drain open, so it can be seen
        await leg_on(group, 1)
        for worker in (0, 1):
            async with group.via(worker).post("http://worker/admin/drain",
                                              headers=auth(VICTIM)) as response:
                assert response.status == 403, await response.text()
                assert (await response.json())["error"]["code"] == "operator_only"
        await asyncio.sleep(0.5)
        for worker in (0, 1):
            async with group.via(worker).get("http://worker/health/ready") as response:
                assert response.status == 200  # neither worker drains
        async with group.via(0).post("http://worker/admin/drain",
                                     headers=auth("sk-operator")) as response:
            assert response.status == 202

        async def both_draining() -> bool:
            statuses = []
            for worker in (0, 1):
                async with group.via(worker).get("http://worker/health/ready") as response:
                    statuses.append(response.status)
            return statuses == [503, 503]
        await wait_for_async(both_draining, 10)


async def test_unauthenticated_bodies_are_refused_before_placement(tmp_path: Path) -> None:
    """Worker 0 full (its echo plugin holds one call): 20 unauthenticated POSTs trickling
    their bodies get 401 at once instead of being read to place them elsewhere; a keyed one
    that trickles gets 408 at the body deadline."""
    async with attacked(tmp_path / "w", "--echo-max-sessions", "1",
                        "--body-timeout", "2") as (group, _):
        await leg_on(group, 0)
        entry = str(group.folder / "worker-0.sock")
        trickle = head("POST", RTP, "Content-Type: application/json", "Content-Length: 100") + b"{"
        started = time.monotonic()
        answers = await asyncio.gather(*(raw(entry, trickle, wait=4.0, until=b"}")
                                         for _ in range(20)))
        assert all(answer.startswith(b"HTTP/1.1 401") for answer in answers), answers[:2]
        assert time.monotonic() - started < 4.0 + 1.0
        keyed = head("POST", RTP, "Content-Type: application/json", "Content-Length: 100",
                     f"Authorization: Bearer {VICTIM}") + b"{"
        started = time.monotonic()
        answer = await raw(entry, keyed, wait=8.0, until=b"body_timeout")
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert time.monotonic() - started < 5.0


def open_sockets(sockets: list[socket.socket]) -> int:
    """How many of these client sockets the server has not closed."""
    alive = 0
    for sock in sockets:
        try:
            if sock.recv(65536, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                alive += 1  # an answer, the connection kept open
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
    return alive


async def test_the_per_address_limit_holds_across_workers_and_handoffs(tmp_path: Path) -> None:
    """`--max-unauthenticated-per-address 16` with 2 workers: 100 idle connections from one
    address leave at most 16 open (before: 16 per worker), and so do 100 unauthenticated
    media-stream upgrades while worker 0 is heavier and hands streams over (before: the
    handed ones were adopted past the limit and kept open after their 401)."""
    async with attacked(tmp_path / "w", "--max-unauthenticated-per-address", "16") as (group, _):
        port = worker_port(group)
        loop = asyncio.get_running_loop()

        async def connect() -> socket.socket:
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", port))
            return sock

        idle = [await connect() for _ in range(100)]
        await asyncio.sleep(1.0)
        assert open_sockets(idle) <= 16, open_sockets(idle)
        for sock in idle:
            sock.close()
        await asyncio.sleep(0.5)

        for _ in range(3):  # worker 0 holds MARGIN more calls: it hands streams over
            await leg_on(group, 0)
        upgrade = head("GET", "/v1/telephony/media-stream", "Upgrade: websocket",
                       "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==")
        upgrades = []
        for _ in range(100):
            sock = await connect()
            with contextlib.suppress(OSError):
                await loop.sock_sendall(sock, upgrade)
            upgrades.append(sock)
        await asyncio.sleep(1.5)
        assert open_sockets(upgrades) <= 16, open_sockets(upgrades)
        for sock in upgrades:
            sock.close()


async def test_secrets_per_key_are_the_whole_servers(tmp_path: Path) -> None:
    async with attacked(tmp_path / "w", "--max-secrets-per-key", "3") as (group, _):
        statuses = []
        for index in range(8):
            async with group.via(index % 2).post("http://worker/v1/realtime/client_secrets",
                                                 headers=auth(VICTIM), json={}) as response:
                statuses.append(response.status)
        assert statuses.count(200) == 3 and statuses.count(429) == 5, statuses
        # another key is not held back by this one
        async with group.via(1).post("http://worker/v1/realtime/client_secrets",
                                     headers=auth(OTHER), json={}) as response:
            assert response.status == 200


SLOW_ANSWER_S = 2.0  # a control request answered later than this counts as a wrong answer
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "BREW", "G\x01T"]
FRAMING = ["", "Content-Length: 0", "Content-Length: 2", "Content-Length: 99999999",
           "Content-Length: -1", "Content-Length: 5\r\nContent-Length: 7",
           "Transfer-Encoding: chunked", "Transfer-Encoding: chunked\r\nContent-Length: 4",
           "Transfer-Encoding: gzip, chunked", "Expect: 100-continue\r\nContent-Length: 3",
           "X-Agent-Worker-Forwarded: 1", "Connection: keep-alive", "Content-Length: 1x"]
BODIES = [b"", b"{}", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", b'{"remote": "127.0.0.1:9"}',
          b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n", bytes(range(256))]


def fuzz_request(rng: random.Random, paths: list[str]) -> bytes:
    lines = [rng.choice(FRAMING) for _ in range(rng.randint(0, 2))]
    if rng.random() < 0.3:
        lines.append(f"Authorization: Bearer {rng.choice([OTHER, 'ek_' + 'x' * 32, 'junk'])}")
    return head(rng.choice(METHODS), rng.choice(paths), *(line for line in lines if line)) + \
        rng.choice(BODIES)


async def test_fuzzing_the_forwarding_path_delivers_no_wrong_answer(tmp_path: Path) -> None:
    """400 connections of random methods, framing headers, bodies and pipelined requests,
    4 at a time, while the victim reads its legs on both workers: every one of its answers
    is its own and comes within 2 s, and the server serves it afterwards."""
    async with attacked(tmp_path / "w") as (group, lines):
        legs = [await leg_on(group, 0), await leg_on(group, 1)]
        other = await leg_on(group, 1, OTHER)
        paths = ["/health", "/metrics", "/metrics/calls", "/admin/drain", RTP, "/offer",
                 "/v1/realtime/calls", f"/v1/realtime/calls/call_{legs[0][-ID_TOKEN_CHARS:]}",
                 *(f"{RTP}/{leg}" for leg in [*legs, other])]
        rng = random.Random(28)
        entries: list[str | tuple[str, int]] = [
            ("127.0.0.1", worker_port(group)), str(group.folder / "worker-0.sock"),
            str(group.folder / "worker-1.sock")]
        wrong: list[Any] = []
        checked = 0
        done = asyncio.Event()

        async def victim() -> None:
            nonlocal checked
            while not done.is_set():
                for leg in legs:
                    try:
                        status, body, seconds = await asyncio.wait_for(
                            victim_reads(group, leg), SLOW_ANSWER_S)
                    except asyncio.TimeoutError:
                        status, body, seconds = 0, {}, SLOW_ANSWER_S
                    checked += 1
                    if status != 200 or body.get("call_id") != leg or seconds >= SLOW_ANSWER_S:
                        wrong.append((leg, status, body, seconds))

        async def attacker(seed: int) -> None:
            local = random.Random(seed)
            for _ in range(100):
                data = b"".join(fuzz_request(local, paths) for _ in range(local.randint(1, 3)))
                got = await raw(local.choice(entries), data, wait=0.15)
                assert not leaks(got, legs), got[:400]

        watcher = asyncio.ensure_future(victim())
        try:
            await asyncio.gather(*(attacker(rng.randrange(1 << 30)) for _ in range(4)))
        finally:
            done.set()
            await watcher
        assert checked > 20 and not wrong, (checked, wrong[:3])
        assert not [line for line in lines if "Traceback" in line], "".join(lines[-60:])
        health = await group.health()
        assert [w.get("pid") is not None for w in health["workers"]] == [True, True]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{group.url}{RTP}/{other}", headers=auth(OTHER)) as response:
                assert response.status == 200
