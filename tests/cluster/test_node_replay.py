"""Requests between nodes as an attacker on the path between them sees them: real
redis-server and three node processes on loopback, node B advertised behind a TCP relay
that keeps every byte sent to it (what a capture of the inter-node network holds).

- A forward captured on its way to B and sent again, byte for byte, makes no second leg
  (409 `node_request_replayed`), however often it is sent;
- the same bytes sent to another node are refused there (421 `node_misdirected`);
- node C serves https with a certificate of a test CA: A, started with `--cluster-ca`,
  forwards to it; B, which does not trust that CA, does not (its controls of C's calls
  answer 404 as for a node that does not answer, and it logs why); a sideband websocket
  relayed to C is checked the same way.

Nodes: A (127.0.0.2, `--max-sessions 1`, `--cluster-ca`), B (127.0.0.3, advertised as
127.0.0.5), C (127.0.0.4, https, `--max-sessions 1`). With A and C each holding a call, a
new call at A is placed on B, so each test makes its own captured forward.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.client import HTTPResponse, HTTPSConnection
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cluster.support import (
    REPO,
    SECRET,
    Node,
    Redis,
    free_port,
    http,
    rtp_call,
    start_node,
    stop,
    wait_for,
    wait_serving,
)
from tests.support.tls import ca_signed

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEY, ADMIN = "key-replay-0001", "admin-replay-01"
KEYS = ("--api-key", KEY, "--admin-key", ADMIN)
RELAY_HOST = "127.0.0.5"
RTP = "/v1/telephony/rtp"


def bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Relay:
    """A TCP relay from `listen` to a node, keeping every byte sent to the node."""

    def __init__(self, listen: tuple[str, int], node: tuple[str, int]) -> None:
        self.node = node
        self.server = socket.create_server(listen)
        self.server.settimeout(0.1)
        self.sent: list[bytearray] = []  # per connection, what went to the node
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.closing = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closing:
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.node, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            record = bytearray()
            with self.lock:
                self.sent.append(record)
                self.sockets += [client, upstream]
            for source, sink, kept in ((client, upstream, record), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(source, sink, kept),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket,
              record: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if record is not None:
                    with self.lock:
                        record.extend(data)
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def requests(self) -> list[bytes]:
        """Every whole request sent to the node so far, as sent."""
        with self.lock:
            streams = [bytes(record) for record in self.sent]
        found = []
        for stream in streams:
            while b"\r\n\r\n" in stream:
                head, _, rest = stream.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) < length:
                    break
                found.append(head + b"\r\n\r\n" + rest[:length])
                stream = rest[length:]
        return found

    def close(self) -> None:
        self.closing = True
        self.server.close()
        self.thread.join(5)
        with self.lock:
            for end in self.sockets:
                end.close()


def send_raw(host: str, port: int, request: bytes) -> tuple[int, dict[str, Any]]:
    """`request`'s bytes sent as they are on a new connection: the answer's status and
    JSON body."""
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        answer = HTTPResponse(sock)
        answer.begin()
        body = answer.read()
    return answer.status, json.loads(body) if body else {}


@dataclass
class TlsNode:
    host: str
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    context: ssl.SSLContext
    tag: str = ""

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        connection = HTTPSConnection(self.host, self.port, timeout=10,
                                                 context=self.context)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        return answer.status, json.loads(data) if data else {}


def start_tls_node(folder: Path, host: str, redis_url: str, cert: Path, key: Path,
                   ca: Path, *flags: str) -> TlsNode:
    port = free_port(host)
    log_path = folder / f"node-{host}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "signaling", "--host", host, "--port", str(port),
             "--ice-host", host, "--cluster", redis_url, "--node-address",
             f"https://{host}:{port}", "--tls-cert", str(cert), "--tls-key", str(key),
             "--workers", "1", "--log-level", "INFO", *flags],
            stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
            env={**os.environ, "AGENT_CLUSTER_SECRET": SECRET})
    return TlsNode(host, port, log_path, process, ssl.create_default_context(cafile=ca))


def calls_on(node: Node | TlsNode) -> list[str]:
    """The ids of the calls and legs the node holds (its operator's view)."""
    if isinstance(node, TlsNode):
        status, body = node.request("GET", "/metrics/calls", headers=bearer(ADMIN))
    else:
        status, _, raw = http("GET", node.url + "/metrics/calls", headers=bearer(ADMIN))
        body = json.loads(raw)
    assert status == 200, body
    return [str(call["call_id"]) for call in body["calls"]]


@dataclass
class Trio:
    redis: Redis
    a: Node
    b: Node
    c: TlsNode
    relay: Relay


@pytest.fixture(scope="module")
def trio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trio]:
    folder = tmp_path_factory.mktemp("replay")
    redis = Redis(folder / "redis")
    redis.start()
    ca, cert, key = ca_signed(folder, "127.0.0.4")
    relay_port = free_port(RELAY_HOST)
    nodes: list[Node | TlsNode] = []
    relay: Relay | None = None
    try:
        a = start_node(folder, "127.0.0.2", redis.url, *KEYS, "--max-sessions", "1",
                       "--cluster-ca", str(ca))
        nodes.append(a)
        b = start_node(folder, "127.0.0.3", redis.url, *KEYS, "--max-sessions", "8",
                       "--node-address", f"http://{RELAY_HOST}:{relay_port}")
        nodes.append(b)
        relay = Relay((RELAY_HOST, relay_port), (b.host, b.port))
        c = start_tls_node(folder, "127.0.0.4", redis.url, cert, key, ca, *KEYS,
                           "--max-sessions", "1")
        nodes.append(c)
        wait_serving(a)
        wait_serving(b)

        def c_serving() -> bool:
            if c.process.poll() is not None:
                raise AssertionError("node exited:\n" + c.log())
            status, health = c.request("GET", "/health")
            c.tag = health["cluster"]["node"]
            return status == 200 and len(health["cluster"]["nodes"]) == 3
        wait_for(c_serving, 60, "node 127.0.0.4 serving https")
        # C holds a call (made at C: a tie stays on the node asked), so it has no room
        status, leg = c.request("POST", RTP, json.dumps(
            {"remote": "127.0.0.1:9", "codec": "PCMU"}).encode(),
            {**bearer(), "Content-Type": "application/json"})
        assert status == 201 and leg["call_id"] in calls_on(c), leg
        yield Trio(redis, a, b, c, relay)
    finally:
        if relay is not None:
            relay.close()
        for node in nodes:
            stop(node.process)
        redis.stop()


def forward_captured(trio: Trio) -> tuple[str, str, bytes]:
    """A new leg made at A while A holds one: placed on B, through the relay. (A's leg, B's
    leg, the forward to B as it was captured.)"""
    status, held = rtp_call(trio.a.url, bearer())
    assert status == 201 and held["call_id"] in calls_on(trio.a), held
    status, placed = rtp_call(trio.a.url, bearer())
    assert status == 201, placed
    assert placed["call_id"] in calls_on(trio.b), placed
    forwards = [request for request in trio.relay.requests()
                if request.startswith(f"POST {RTP} ".encode())]
    assert forwards
    return held["call_id"], placed["call_id"], forwards[-1]


def end(node: Node, call: str) -> None:
    status, _, body = http("DELETE", f"{node.url}{RTP}/{call}", headers=bearer())
    assert status == 200, body


def test_a_captured_forward_sent_again_makes_no_second_leg(trio: Trio) -> None:
    held, placed, captured = forward_captured(trio)
    try:
        before = calls_on(trio.b)
        answers = [send_raw(trio.b.host, trio.b.port, captured) for _ in range(4)]
        assert [(status, body.get("error", {}).get("code")) for status, body in answers] == [
            (409, "node_request_replayed")] * 4, answers
        assert calls_on(trio.b) == before  # no leg made, placement not skipped
    finally:
        end(trio.a, held)
        end(trio.a, placed)


def test_a_forward_signed_for_one_node_is_refused_at_another(trio: Trio) -> None:
    held, placed, captured = forward_captured(trio)
    end(trio.a, held)  # A has room again: only the signature can keep the leg out
    try:
        status, body = send_raw(trio.a.host, trio.a.port, captured)
        assert (status, body.get("error", {}).get("code")) == (421, "node_misdirected"), body
        assert calls_on(trio.a) == []
    finally:
        for call in [placed, *calls_on(trio.a)]:
            end(trio.a, call)


def test_https_node_addresses_are_checked_with_the_cluster_ca(trio: Trio) -> None:
    (call,) = calls_on(trio.c)
    path = f"{RTP}/{call}"
    # A trusts the test CA (--cluster-ca): the control reaches C over https
    status, _, body = http("GET", trio.a.url + path, headers=bearer())
    assert status == 200 and json.loads(body)["call_id"] == call, body
    # B trusts only the system's CAs: C's certificate is refused, as a node not answering
    status, _, body = http("GET", trio.b.url + path, headers=bearer())
    assert status == 404 and json.loads(body)["error"]["code"] == "call_not_found", body
    wait_for(lambda: "certificate is not trusted" in trio.b.log(), 5,
             "B to log the untrusted certificate")


async def test_a_sideband_reaches_an_https_node_with_the_cluster_ca(trio: Trio) -> None:
    """The websocket relay to another node verifies its certificate as forwards do."""
    (call,) = calls_on(trio.c)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(f"{trio.a.url}/v1/realtime?call_id={call}",
                                      headers=bearer()) as socket:
            message = await socket.receive(timeout=10)
            assert message.type == aiohttp.WSMsgType.TEXT, message
            assert json.loads(message.data)["type"] == "session.created"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{trio.b.url}/v1/realtime?call_id={call}",
                                     headers=bearer())
        assert refused.value.status == 404  # C's certificate is not trusted at B
