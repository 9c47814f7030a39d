"""`--workers 2`: a real server process with two workers. Each worker's private unix socket
lets a test pick which worker a request lands on: a call made on one worker is read, trickled
and ended through the other; a secret minted on one makes its calls there; the whole-server
views add both up; a killed worker is started again while the other's call goes on; SIGTERM
drains both."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCSessionDescription
from prometheus_client.parser import text_string_to_metric_families

from agent.worker_tag import ID_TOKEN_CHARS, worker_of
from tests.support.realtime import RealtimeClient, ice_credentials, sdpfrag, strip_candidates
from tests.support.server_process import Process, running_server
from tests.support.tls import self_signed

CALLS = "/v1/realtime/calls"


class Workers:
    def __init__(self, process: Process, url: str, folder: Path) -> None:
        self.process = process
        self.url = url
        self.folder = folder
        self.sessions: dict[int, aiohttp.ClientSession] = {}
        self.clients: list[RealtimeClient] = []

    def via(self, worker: int) -> aiohttp.ClientSession:
        """A client session whose requests land on `worker` (base URL http://worker)."""
        if worker not in self.sessions:
            connector = aiohttp.UnixConnector(path=str(self.folder / f"worker-{worker}.sock"))
            self.sessions[worker] = aiohttp.ClientSession(connector=connector)
        return self.sessions[worker]

    async def health(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http:
            async with http.get(self.url + "/health") as response:
                return await response.json()

    async def call_on(self, worker: int, headers: dict[str, str] | None = None
                      ) -> RealtimeClient:
        client = RealtimeClient("http://worker")
        self.clients.append(client)
        sdp = await client.offer_sdp()
        async with self.via(worker).post(
                "http://worker" + CALLS, data=sdp,
                headers={"Content-Type": "application/sdp", **(headers or {})}) as response:
            answer = await response.text()
            assert response.status == 201, answer
            client.location = response.headers["Location"]
        await client.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        await asyncio.wait_for(client.connected.wait(), 20)
        return client

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
        for session in self.sessions.values():
            await session.close()


@contextlib.asynccontextmanager
async def two_workers(folder: Path, *flags: str) -> AsyncIterator[Workers]:
    """A server with two workers, once both answer; its clients closed on the way out."""
    async with running_server("--workers", "2", "--worker-dir", str(folder),
                              *flags) as (process, url, _):
        group = Workers(process, url, folder)

        async def both_up() -> bool:
            health = await group.health()
            return [w.get("pid") is not None for w in health["workers"]] == [True, True]
        await wait_for_async(both_up, 60)
        try:
            yield group
        finally:
            await group.close()


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[Workers]:
    async with two_workers(tmp_path / "workers") as group:
        yield group


async def wait_for_async(predicate: Any, timeout: float) -> None:
    async def poll() -> None:
        while True:
            try:
                if await predicate():
                    return
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.1)
    await asyncio.wait_for(poll(), timeout)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """A supervisor run in the test process installs its own SIGTERM/SIGINT handlers: put
    pytest's back afterwards."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def owner(call: RealtimeClient) -> int | None:
    return worker_of(call.call_id, ID_TOKEN_CHARS)


async def test_a_call_is_reached_through_either_worker(workers: Workers) -> None:
    call = await workers.call_on(1)
    assert owner(call) == 1
    await call.wait_audio(0.5)
    path = "http://worker" + call.location
    async with workers.via(0).get(path) as response:  # forwarded to worker 1
        assert response.status == 200
        assert (await response.json())["id"] == call.call_id
    # Trickle through the other worker: the owner applies it and answers with its ETag.
    ufrag, pwd = ice_credentials(call.pc.localDescription.sdp)
    _, candidates = strip_candidates(call.pc.localDescription.sdp)
    async with workers.via(0).patch(path, data=sdpfrag(ufrag, pwd, candidates[:1]), headers={
            "Content-Type": "application/trickle-ice-sdpfrag"}) as response:
        assert response.status == 204, await response.text()
        assert response.headers["ETag"]
    health = await workers.health()
    assert health["active_calls"] == 1 and health["legs"]["webrtc"] == 1
    assert [w["active_calls"] for w in health["workers"]] == [0, 1]
    async with workers.via(0).get("http://worker/metrics") as response:
        text = await response.text()
    active = {tuple(sorted(s.labels.items())): s.value
              for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == "agent_active_calls"}
    assert active[(("plugin", "echo"), ("transport", "webrtc"))] == 1
    async with workers.via(0).get("http://worker/metrics/calls") as response:
        assert [c["call_id"] for c in (await response.json())["calls"]] == [call.call_id]
    async with workers.via(0).delete(path) as response:
        assert response.status == 200, await response.text()

    async def ended() -> bool:
        return (await workers.health())["active_calls"] == 0
    await wait_for_async(ended, 10)


async def test_a_secret_makes_its_calls_on_the_worker_that_minted_it(workers: Workers) -> None:
    async with workers.via(1).post("http://worker/v1/realtime/client_secrets",
                                   json={}) as response:
        assert response.status == 200, await response.text()
        secret = (await response.json())["value"]
    # Only worker 1 knows the secret; through worker 0 the page still reads what it needs.
    for path in ("/v1/models", "/v1/realtime/config"):
        async with workers.via(0).get("http://worker" + path, headers={
                "Authorization": f"Bearer {secret}"}) as response:
            assert response.status == 200, (path, await response.text())
    call = await workers.call_on(0, headers={"Authorization": f"Bearer {secret}"})
    assert owner(call) == 1  # posted to worker 0, made where the secret lives
    async with workers.via(0).delete("http://worker" + call.location,
                                     headers={"Authorization": f"Bearer {secret}"}) as response:
        assert response.status == 200, await response.text()


async def test_a_killed_worker_is_restarted_and_the_other_call_goes_on(
        workers: Workers) -> None:
    survivor, victim = await workers.call_on(0), await workers.call_on(1)
    await survivor.wait_audio(0.5)
    killed_pid = (await workers.health())["workers"][1]["pid"]
    os.kill(killed_pid, signal.SIGKILL)
    heard = survivor.received_seconds
    await asyncio.sleep(1.5)
    assert survivor.received_seconds > heard + 1.0  # worker 0's call never noticed

    async def restarted() -> bool:
        pids = [w.get("pid") for w in (await workers.health())["workers"]]
        return pids[1] is not None and pids[1] != killed_pid
    await wait_for_async(restarted, 30)
    health = await workers.health()
    assert [w["active_calls"] for w in health["workers"]] == [1, 0]
    async with workers.via(0).get("http://worker" + victim.location) as response:
        assert response.status == 404  # gone with its worker
    assert workers.process.returncode is None


async def test_sigterm_drains_every_worker(workers: Workers) -> None:
    calls = [await workers.call_on(0), await workers.call_on(1)]
    workers.process.send_signal(signal.SIGTERM)

    async def both_draining() -> bool:
        statuses = []
        for worker in (0, 1):
            async with workers.via(worker).get("http://worker/health/ready") as response:
                statuses.append((response.status, (await response.json()).get("reasons")))
        return statuses == [(503, ["draining"])] * 2
    await wait_for_async(both_draining, 10)
    assert workers.process.returncode is None  # live calls hold the drain
    for worker, call in enumerate(calls):
        async with workers.via(worker).delete("http://worker" + call.location) as response:
            assert response.status == 200
    assert await asyncio.wait_for(workers.process.wait(), 15) == 0


async def test_max_sessions_is_the_whole_servers_whatever_the_workers(
        tmp_path: Path) -> None:
    """`--max-sessions 1` with 2 workers admits one call, not one per worker: two offers sent
    at once, one through each worker, get one 201 and one 503; after the first call ends, the
    next is admitted wherever it lands."""
    async with two_workers(tmp_path / "workers", "--max-sessions", "1") as group:
        async def offer(worker: int) -> tuple[int, Any]:
            async with group.via(worker).post(
                    "http://worker/v1/telephony/rtp",
                    json={"remote": "127.0.0.1:9", "codec": "PCMU"}) as response:
                return response.status, await response.json()
        for _ in range(3):
            answers = await asyncio.gather(offer(0), offer(1))
            statuses = sorted(status for status, _ in answers)
            assert statuses == [201, 503], answers
            refused = next(body for status, body in answers if status == 503)
            assert refused["error"]["code"] == "server_full"
            admitted = next(body for status, body in answers if status == 201)
            assert (await group.health())["active_calls"] == 1
            async with group.via(0).delete(
                    f"http://worker/v1/telephony/rtp/{admitted['call_id']}") as response:
                assert response.status == 200

            async def freed() -> bool:
                return (await group.health())["active_calls"] == 0
            await wait_for_async(freed, 10)


def test_the_worker_count_follows_the_plugin() -> None:
    from signaling.__main__ import build_parser, worker_count
    parse = build_parser().parse_args
    assert worker_count(parse([])) == (os.cpu_count() or 1)
    assert worker_count(parse(["--workers", "3"])) == 3
    # A model held in the process keeps every call in one process, whatever is asked.
    assert worker_count(parse(["--plugin", "personaplex", "--workers", "4"])) == 1
    assert worker_count(parse(["--plugin", "moshi-server", "--workers", "4"])) == 1
    assert worker_count(parse(["--workers", "4", "--tls-cert", "c.pem", "--tls-key", "k.pem"])) == 4


async def test_a_full_worker_passes_a_new_call_to_one_with_room(tmp_path: Path) -> None:
    async with two_workers(tmp_path / "workers", "--echo-max-sessions", "1") as group:
        first = await group.call_on(0)  # worker 0's one slot
        second = await group.call_on(0)  # full there: made on worker 1
        assert (owner(first), owner(second)) == (0, 1)
        client = RealtimeClient("http://worker")
        group.clients.append(client)
        async with group.via(0).post("http://worker" + CALLS, data=await client.offer_sdp(),
                                     headers={"Content-Type": "application/sdp"}) as response:
            assert response.status == 503  # every worker full
            assert (await response.json())["error"]["code"] == "server_full"


async def test_new_calls_spread_over_the_workers_whichever_accepts_them(
        workers: Workers) -> None:
    """The kernel, not the load, picks the worker that accepts: every new call here arrives
    on worker 0, and a worker holding MARGIN more calls than another hands the call over."""
    from signaling.workers.load import MARGIN

    owners = []
    for _ in range(8):
        async with workers.via(0).post("http://worker/v1/telephony/rtp",
                                       json={"remote": "127.0.0.1:9", "codec": "PCMU"}) as response:
            body = await response.json()
            assert response.status == 201, body
            owners.append(worker_of(body["call_id"], ID_TOKEN_CHARS))
    assert abs(owners.count(0) - owners.count(1)) <= MARGIN, owners
    health = await workers.health()
    assert [w["active_calls"] for w in health["workers"]] == [owners.count(0), owners.count(1)]


def test_a_worker_stopped_while_still_starting_counts_as_drained(tmp_path: Path) -> None:
    """SIGTERM reaching a worker before its drain handler is installed kills it with the
    default action; that worker had no calls yet, so the supervisor still exits 0."""
    import sys
    import threading

    from signaling.workers.supervisor import Supervisor

    class StartingWorkers(Supervisor):
        def command(self, index: int) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(60)"]

        def wait_ready(self, index: int) -> int | None:
            return None

    supervisor = StartingWorkers([], 2, tmp_path, [])
    stop = threading.Timer(0.5, supervisor.on_signal, (signal.SIGTERM, None))
    stop.start()
    try:
        with signal_handlers_kept():
            assert supervisor.run() == 0
    finally:
        stop.cancel()
        for worker in supervisor.workers.values():
            worker.kill()


async def test_the_whole_server_views_carry_cors_headers(tmp_path: Path) -> None:
    origin = "https://app.example"
    async with two_workers(tmp_path / "workers", "--cors-origin", origin) as group:
        for path in ("/health", "/metrics", "/metrics/calls"):
            async with group.via(0).get("http://worker" + path,
                                        headers={"Origin": origin}) as response:
                assert response.status == 200
                assert response.headers.get("Access-Control-Allow-Origin") == origin, path
                assert response.headers.get("Vary") == "Origin"


async def test_workers_serve_tls_and_forward_among_themselves(tmp_path: Path) -> None:
    """The shared port speaks the server's TLS; the workers' private sockets stay plain, so
    a request about a call reaches its owner whichever worker accepted it."""
    import ssl
    cert, key = self_signed(tmp_path)
    folder = tmp_path / "workers"
    async with running_server("--workers", "2", "--worker-dir", str(folder),
                              "--tls-cert", str(cert), "--tls-key", str(key), scheme="https",
                              ready="serving plugin echo on https://") as (process, url, _):
        group = Workers(process, url, folder)
        trusted = ssl.create_default_context(cafile=str(cert))
        try:
            async def both_up() -> bool:
                async with aiohttp.ClientSession() as http:
                    async with http.get(url + "/health", ssl=trusted) as response:
                        workers = (await response.json())["workers"]
                return [w.get("pid") is not None for w in workers] == [True, True]
            await wait_for_async(both_up, 60)
            call = await group.call_on(1)
            landed = set()
            for _ in range(8):  # a new connection each time: either worker may accept it
                async with aiohttp.ClientSession() as http:
                    async with http.get(url + call.location, ssl=trusted) as response:
                        assert response.status == 200
                        assert (await response.json())["id"] == call.call_id
                    async with http.get(url + "/health", ssl=trusted) as response:
                        workers = (await response.json())["workers"]
                        landed.add(tuple(w["active_calls"] for w in workers))
            assert landed == {(0, 1)}
            async with aiohttp.ClientSession() as http:
                async with http.delete(url + call.location, ssl=trusted) as response:
                    assert response.status == 200
        finally:
            await group.close()


async def test_a_media_stream_on_a_full_worker_is_relayed_to_one_with_room(
        tmp_path: Path) -> None:
    import json
    stream = "/v1/telephony/media-stream"
    async with two_workers(tmp_path / "workers", "--echo-max-sessions", "1") as group:
        await group.call_on(0)  # worker 0's one slot
        socket = await open_media_stream(group.via(0), 1)
        sid = "MZ1"
        heard = MediaHeard(socket)
        for _ in range(75):  # 1.5 s in real time
            await socket.send_str(json.dumps({"event": "media", "streamSid": sid,
                                              "media": {"payload": TONE_PAYLOAD}}))
            await asyncio.sleep(0.02)
        received = heard.count
        health = await group.health()
        assert [w["legs"].get("media-stream", 0) for w in health["workers"]] == [0, 1]
        assert received >= 40, received  # the agent's audio comes back through the relay
        # Every worker full now: refused before the upgrade, as a single server would.
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await group.via(0).ws_connect("http://worker" + stream)
        assert refused.value.status == 503
        await socket.send_str(json.dumps({"event": "stop", "streamSid": sid}))
        await asyncio.wait_for(heard.reader, 10)  # the worker's close reaches the caller
        assert socket.closed

        async def freed() -> bool:
            return (await group.health())["legs"].get("media-stream", 0) == 0
        await wait_for_async(freed, 10)


def test_a_signal_that_comes_while_a_worker_is_being_started_reaches_it(
        tmp_path: Path) -> None:
    import sys

    from signaling.workers.supervisor import Supervisor

    class SignalledDuringSpawn(Supervisor):
        def command(self, index: int) -> list[str]:
            if index == 1:  # SIGTERM lands while worker 1 is being started
                self.on_signal(signal.SIGTERM, None)
            return [sys.executable, "-c", "import time; time.sleep(3)"]

        def wait_ready(self, index: int) -> int | None:
            return None

    supervisor = SignalledDuringSpawn([], 2, tmp_path, [])
    started = []
    original_spawn = supervisor.spawn

    def spawn(index: int):  # type: ignore[no-untyped-def]
        started.append(original_spawn(index))
        return started[-1]
    supervisor.spawn = spawn  # type: ignore[method-assign]
    with signal_handlers_kept():
        assert supervisor.run() == 0
    # Both were stopped by the signal, not left to run to their end (exit 0 after 3 s).
    assert [worker.returncode for worker in started] == [-signal.SIGTERM] * 2


async def test_nice_applies_to_every_worker(tmp_path: Path) -> None:
    niceness = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)  # raising it needs no privilege
    async with two_workers(tmp_path / "workers", "--nice", str(niceness)) as group:
        pids = [worker["pid"] for worker in (await group.health())["workers"]]
        assert len(pids) == 2
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [niceness] * 2
        assert os.getpriority(os.PRIO_PROCESS, group.process.pid) == niceness


def _tone_payload() -> str:
    import base64

    import numpy as np

    from agent.telephony.g711 import mulaw_encode
    tone = (np.sin(2 * np.pi * 440 * np.arange(160) / 8000) * 8000).astype(np.int16)
    return base64.b64encode(mulaw_encode(tone)).decode()


TONE_PAYLOAD = _tone_payload()  # 20 ms of a 440 Hz tone, μ-law, as a media event carries it


class MediaHeard:
    """Counts the agent's `media` events on a media-stream socket until it closes."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.count = 0
        self.reader = asyncio.ensure_future(self._read(socket))

    async def _read(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        import json
        async for message in socket:
            if json.loads(message.data).get("event") == "media":
                self.count += 1


async def open_media_stream(session: aiohttp.ClientSession, index: int, key: str | None = None
                            ) -> aiohttp.ClientWebSocketResponse:
    """Stream `index`, its credential (if any) in the header (even) or the URL (odd)."""
    import json
    if key is None:
        socket = await session.ws_connect("http://worker/v1/telephony/media-stream")
    elif index % 2:
        socket = await session.ws_connect(f"http://worker/v1/telephony/media-stream?token={key}")
    else:
        socket = await session.ws_connect("http://worker/v1/telephony/media-stream",
                                          headers={"Authorization": f"Bearer {key}"})
    sid = f"MZ{index}"
    await socket.send_str(json.dumps({"event": "connected", "protocol": "Call"}))
    await socket.send_str(json.dumps({"event": "start", "streamSid": sid, "start": {
        "streamSid": sid, "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                          "channels": 1}}}))
    return socket


async def test_media_streams_accepted_by_one_worker_are_handed_to_the_lighter_one(
        tmp_path: Path) -> None:
    async with two_workers(tmp_path / "workers", "--api-key", "sk-handoff-test") as group:
        await media_streams_handed_over(group, "sk-handoff-test")


async def media_streams_handed_over(workers: Workers, key: str) -> None:
    """Every stream arrives on worker 0 (none is full, so none is relayed); one holding MARGIN
    more calls than the other hands the connection itself over, and it works there, its
    credential checked there (in the header or the URL)."""
    import json
    import socket as sockets_module

    from signaling.workers.handoff import handoff_socket_path
    from signaling.workers.load import MARGIN

    # A datagram that carries no connection is dropped, and the worker goes on.
    with sockets_module.socket(sockets_module.AF_UNIX, sockets_module.SOCK_DGRAM) as junk:
        junk.sendto(b"GET / HTTP/1.1\r\n\r\n", str(handoff_socket_path(workers.folder, 1)))
    sockets = []
    for index in range(8):
        sockets.append(await open_media_stream(workers.via(0), index, key))

        async def admitted() -> bool:
            health = await workers.health()
            return sum(w["legs"].get("media-stream", 0) for w in health["workers"]) == len(sockets)
        await wait_for_async(admitted, 10)
    health = await workers.health()
    held = [w["legs"].get("media-stream", 0) for w in health["workers"]]
    assert sum(held) == 8 and abs(held[0] - held[1]) <= MARGIN, held

    # A handed stream is served in full by its new worker: the agent's audio comes back.
    heard = MediaHeard(sockets[-1])
    for _ in range(50):
        for index, socket in enumerate(sockets):
            await socket.send_str(json.dumps({"event": "media", "streamSid": f"MZ{index}",
                                              "media": {"payload": TONE_PAYLOAD}}))
        await asyncio.sleep(0.02)
    assert heard.count >= 25, heard.count
    for socket in sockets:
        await socket.close()
    await asyncio.wait_for(heard.reader, 10)

    async def freed() -> bool:
        return (await workers.health())["legs"].get("media-stream", 0) == 0
    await wait_for_async(freed, 10)


async def test_the_worker_mark_counts_only_on_a_workers_private_socket(
        workers: Workers) -> None:
    """A client that sends the header workers mark forwarded requests with is still routed:
    on one connection to the public port, a leg held by either worker is reached."""
    from signaling.workers.channel import FORWARDED_HEADER

    call_ids = []
    for worker in (0, 1):  # one leg on each worker (each is the lighter one in turn)
        async with workers.via(worker).post("http://worker/v1/telephony/rtp",
                                            json={"remote": "127.0.0.1:9", "codec": "PCMU"}
                                            ) as response:
            body = await response.json()
            assert response.status == 201, body
            call_ids.append(body["call_id"])
    assert [worker_of(i, ID_TOKEN_CHARS) for i in call_ids] == [0, 1]
    async with aiohttp.ClientSession() as http:  # one connection: one accepting worker
        for call_id in call_ids:
            async with http.get(f"{workers.url}/v1/telephony/rtp/{call_id}",
                                headers={FORWARDED_HEADER: "1"}) as response:
                assert response.status == 200, await response.text()
            async with http.delete(f"{workers.url}/v1/telephony/rtp/{call_id}",
                                   headers={FORWARDED_HEADER: "0"}) as response:
                assert response.status in (200, 204), await response.text()


async def test_an_existing_worker_dir_keeps_its_mode_and_loses_only_the_workers_files(
        tmp_path: Path) -> None:
    """`--worker-dir` naming a folder that exists (it could be /tmp): its mode is left as it
    was, what the workers make in it is private to this user (0600), and at stop exactly
    that is removed; a file of someone else's in the folder stays."""
    import stat
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o755)
    keep = folder / "someone-elses.txt"
    keep.write_text("not ours")
    async with two_workers(folder) as group:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755
        made = sorted(path.name for path in folder.iterdir() if path != keep)
        assert {"worker-0.sock", "worker-1.sock", "handoff-0.sock", "loads"} <= set(made), made
        for name in made:
            assert stat.S_IMODE((folder / name).stat().st_mode) & 0o077 == 0, name
        group.process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(group.process.wait(), 30) == 0
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert [path.name for path in folder.iterdir()] == [keep.name]
