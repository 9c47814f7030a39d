"""A real cluster on loopback for the tests: redis-server, agent nodes as `python -m
signaling` processes on their own 127.0.0.x addresses, and HAProxy with deploy/haproxy.cfg
in front. Every process is started here, bounded in time, and stopped by its PID.

Programs missing here skip the tests that need them, and fail them when env CI is set
(scripts/install-test-deps.sh installs them there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc.rtp import RtpPacket

from agent.telephony.codec import PCMU

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"
SECRET = "cluster-secret-for-tests-0123456789"
PREFIX = "agent:"


def require(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{program} is missing under CI (scripts/install-test-deps.sh)")
        pytest.skip(f"{program} is not installed (apt-get install {program})")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
    if process.poll() is None:
        process.kill()
        process.wait(5)


def http(method: str, url: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10
         ) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


class Redis:
    """redis-server on a free loopback port, no persistence."""

    def __init__(self, folder: Path, also_bind: str = "") -> None:
        self.folder = folder
        self.port = free_port()
        self.also_bind = also_bind  # a bridge address the nodes' namespaces reach it on
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.also_bind or '127.0.0.1'}:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [require("redis-server"), "--port", str(self.port), "--bind",
             " ".join(["127.0.0.1", *([self.also_bind] if self.also_bind else [])]),
             # the nodes' namespaces are "outside" to Redis: its own bridge, made for the test
             *(["--protected-mode", "no"] if self.also_bind else []),
             "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self.command("PING") == "PONG", 10, "redis-server")

    def command(self, *words: str) -> Any:
        """One command over RESP (a tiny client, so the tests' view of Redis is not the
        code's under test)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            parts = [f"*{len(words)}\r\n"] + [f"${len(w.encode())}\r\n{w}\r\n" for w in words]
            sock.sendall("".join(parts).encode())
            reader = sock.makefile("rb")
            return _read_reply(reader)

    def keys(self, pattern: str) -> list[str]:
        return sorted(self.command("KEYS", pattern))

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


def _read_reply(reader: Any) -> Any:
    line = reader.readline().decode().rstrip("\r\n")
    kind, rest = line[:1], line[1:]
    if kind in "+":
        return rest
    if kind == "-":
        raise RuntimeError(rest)
    if kind == ":":
        return int(rest)
    if kind == "$":
        if int(rest) < 0:
            return None
        data = reader.read(int(rest) + 2)
        return data[:-2].decode()
    if kind == "*":
        return [_read_reply(reader) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


@dataclass
class Node:
    host: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    tag: str = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, Any]:
        status, _, body = http("GET", self.url + "/health")
        assert status == 200, body
        return dict(json.loads(body))

    def ready(self) -> int:
        return http("GET", self.url + "/health/ready", timeout=2)[0]


def start_node(folder: Path, host: str, redis_url: str, *flags: str,
               env: dict[str, str] | None = None, netns: str = "") -> Node:
    # in a namespace of its own every port is free
    port = NETNS_PORT if netns else free_port(host)
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / f"node-{host}.log"
    inside = ["ip", "netns", "exec", netns] if netns else []
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*inside, sys.executable, "-m", "signaling", "--host", host, "--port", str(port),
             "--ice-host", host, "--cluster", redis_url, "--node-address",
             f"http://{host}:{port}", "--connect-timeout", "120", "--workers", "1",
             "--log-level", "INFO", *flags],
            stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
            env={**os.environ, "AGENT_CLUSTER_SECRET": SECRET, **(env or {})})
    return Node(host, port, log_path, process)


def wait_serving(node: Node, timeout: float = 60) -> None:
    def serving() -> bool:
        if node.process.poll() is not None:
            raise AssertionError("node exited:\n" + node.log())
        health = node.health()
        node.tag = health["cluster"]["node"]
        return node.ready() == 200
    wait_for(serving, timeout, f"node {node.host} serving")


class HAProxy:
    def __init__(self, folder: Path, nodes: list[Node]) -> None:
        self.port = free_port()
        self.nodes = nodes
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "AGENT_LB_BIND": f"127.0.0.1:{self.port}"}
        for index, node in enumerate(self.nodes, 1):
            env[f"AGENT_NODE{index}"] = f"{node.host}:{node.port}"
        self.process = subprocess.Popen(
            [require("haproxy"), "-db", "-f", str(HAPROXY_CFG)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: http("GET", self.url + "/health/live", timeout=2)[0] == 200, 10,
                 "haproxy")

    def stop(self) -> None:
        if self.process is not None:
            stop(self.process)


@dataclass
class Cluster:
    redis: Redis
    nodes: list[Node]
    balancer: HAProxy
    calls: list[str] = field(default_factory=list)

    def node_of(self, tag: str) -> Node:
        return next(node for node in self.nodes if node.tag == tag)


NETNS_PORT = 8080


def _ip(*words: str) -> None:
    subprocess.run(["ip", *words], check=True, capture_output=True, timeout=10)


@contextlib.contextmanager
def network_namespaces(count: int) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """`count` network namespaces on one bridge made here: (the bridge's address, [(name,
    address)]); all of it deleted on the way out. Skipped without root or `ip` (a failure
    under CI)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI"):
            pytest.fail("network namespaces need root and iproute2 under CI")
        pytest.skip("network namespaces need root and iproute2 (ip netns)")
    tag = os.urandom(2).hex()
    subnet = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:], 16)}"
    bridge = f"agc{tag}"
    names = [f"agc{tag}n{i}" for i in range(count)]
    made: list[str] = []
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        spaces = []
        for index, name in enumerate(names):
            _ip("netns", "add", name)
            made.append(name)
            outside, inside = f"agc{tag}h{index}", f"agc{tag}p{index}"
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", name)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            address = f"{subnet}.{index + 2}"
            for words in (("link", "set", "lo", "up"),
                          ("addr", "add", f"{address}/24", "dev", inside),
                          ("link", "set", inside, "up"),
                          ("route", "add", "default", "via", f"{subnet}.1")):
                _ip("netns", "exec", name, "ip", *words)
            spaces.append((name, address))
    except (subprocess.CalledProcessError, OSError) as exc:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10)
        if os.environ.get("CI"):
            pytest.fail(f"cannot make network namespaces: {exc}")
        pytest.skip(f"cannot make network namespaces here: {exc}")
    try:
        yield f"{subnet}.1", spaces
    finally:
        for name in made:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=10)


@contextlib.contextmanager
def running_cluster(folder: Path, flags: tuple[tuple[str, ...], ...],
                    hosts: tuple[str, ...] = ("127.0.0.2", "127.0.0.3", "127.0.0.4"),
                    namespaces: tuple[str, ...] = (), redis_bind: str = "",
                    ) -> Iterator[Cluster]:
    """Redis, a node per entry of `flags` (each its own flags; in `namespaces` where given),
    HAProxy in front."""
    require("redis-server")
    require("haproxy")
    redis = Redis(folder / "redis", redis_bind)
    nodes: list[Node] = []
    balancer: HAProxy | None = None
    spaces = namespaces or ("",) * len(flags)
    try:
        redis.start()
        nodes = [start_node(folder, host, redis.url, *own, netns=space)
                 for host, own, space in zip(hosts, flags, spaces, strict=False)]
        for node in nodes:
            wait_serving(node)
        balancer = HAProxy(folder, nodes)
        balancer.start()
        yield Cluster(redis, nodes, balancer)
    finally:
        if balancer is not None:
            balancer.stop()
        for node in nodes:
            stop(node.process)
        redis.stop()


def rtp_call(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A plain RTP leg (the cheapest call): its status and JSON answer."""
    status, _, body = http("POST", url + "/v1/telephony/rtp",
                           json.dumps({"remote": "127.0.0.1:9", "codec": "PCMU"}).encode(),
                           {"Content-Type": "application/json", **(headers or {})})
    return status, json.loads(body) if body else {}


class RtpCaller(asyncio.DatagramProtocol):
    """A phone on a plain RTP leg: sends a tone every 20 ms to the leg, and keeps when each
    of the agent's packets came (its sequence number and RTP timestamp)."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.arrivals: list[tuple[float, int, int]] = []  # (monotonic, sequence, timestamp)
        self._sender: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls) -> RtpCaller:
        _, caller = await asyncio.get_running_loop().create_datagram_endpoint(
            cls, local_addr=("127.0.0.1", 0))
        return caller

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    @property
    def address(self) -> str:
        assert self.transport is not None
        host, port = self.transport.get_extra_info("sockname")[:2]
        return f"{host}:{port}"

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            packet = RtpPacket.parse(data)
        except ValueError:
            return
        self.arrivals.append((time.monotonic(), packet.sequence_number, packet.timestamp))

    def start(self, leg: str) -> None:
        """Send a 440 Hz tone to the leg's `local` address until `stop`."""
        host, port = leg.rsplit(":", 1)
        self._sender = asyncio.ensure_future(self._send((host, int(port))))

    async def _send(self, to: tuple[str, int]) -> None:
        tone = (np.sin(2 * np.pi * 440 * np.arange(160) / 8000) * 8000).astype(np.int16)
        payload = PCMU.encode(tone)
        started, index = time.monotonic(), 0
        while self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(RtpPacket(payload_type=0, sequence_number=index & 0xFFFF,
                                            timestamp=(index * 160) & 0xFFFFFFFF, ssrc=0x5EED,
                                            payload=payload).serialize(), to)
            index += 1
            await asyncio.sleep(max(0.0, started + index * 0.02 - time.monotonic()))

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        if self.transport is not None:
            self.transport.close()

    def counted(self, since: float, until: float, late_s: float) -> tuple[int, int, int]:
        """What came between `since` and `until`: (packets, missing ones by sequence number,
        late ones: more than `late_s` behind the earliest packet by their RTP timestamps)."""
        window = [(at, seq, ts) for at, seq, ts in self.arrivals if since <= at <= until]
        if not window:
            return 0, 0, 0
        _, first_seq, first_ts = window[0]
        sequences = {(seq - first_seq) & 0xFFFF for _, seq, _ in window}
        missing = max(sequences) + 1 - len(sequences)
        offsets = [at - ((ts - first_ts) & 0xFFFFFFFF) / 8000 for at, _, ts in window]
        late = sum(offset - min(offsets) > late_s for offset in offsets)
        return len(window), missing, late
