"""Cluster mode end to end: redis-server, three agent nodes (`python -m signaling
--cluster ...`, each on its own 127.0.0.x address, the third with `--workers 2`) and HAProxy
with deploy/haproxy.cfg in front, all real processes on loopback. The tests share one
cluster and run in order: the last ones pause and restart Redis, kill a node (counting the
RTP packets of the other nodes' calls across the kill) and drain one. Sidebands and media
streams cross nodes too (signaling/cluster/sockets.py), and /health shows every node's
media addresses.

Smaller than the issue's counts, to keep the run short on a 2-core machine: capacity 3 x 4
(burst of 16 admits exactly 12), 12 WebRTC calls through the balancer, 12 secrets minted at
one node and redeemed at another, 12 redemption races; benchmarks/cluster_bench.py runs the
issue's full counts.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.cluster.support import Cluster, Node, RtpCaller, running_cluster, wait_for
from tests.support.realtime import RealtimeClient, offer_sdp_once

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEYS = ("key-one-0001", "key-two-0002", "key-three-03", "key-four-004")
ADMIN = "admin-key-0000"
CAPACITY = 4  # per node
PER_KEY = 5
# --max-secrets-per-key 3 (the secrets tests mint at most 3 unused at a time)
COMMON = ("--max-sessions", str(CAPACITY), "--max-calls-per-key", str(PER_KEY),
          "--admin-key", ADMIN, "--drain-seconds", "60", "--max-secrets-per-key", "3",
          *[flag for key in KEYS for flag in ("--api-key", key)])
TTL_S = 6.0
LATE_S = 0.2  # an RTP packet this far behind its stream's schedule counts as late


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("cluster")
    with running_cluster(folder, (COMMON, COMMON, (*COMMON, "--workers", "2"))) as running:
        yield running


def tag_of(call_id: str) -> str:
    """The node tag an id carries (the first character of its 24-character random part)."""
    return call_id[-24]


async def post_offer(session: aiohttp.ClientSession, url: str, sdp: str,
                     headers: dict[str, str]) -> tuple[int, dict[str, str], str]:
    async with session.post(url + "/v1/realtime/calls", data=sdp,
                            headers={**headers, "Content-Type": "application/sdp"}) as response:
        return response.status, dict(response.headers), await response.text()


async def rtp(session: aiohttp.ClientSession, url: str, key: str
              ) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.post(url + "/v1/telephony/rtp", headers=bearer(key),
                            json={"remote": "127.0.0.1:9", "codec": "PCMU"}) as response:
        return response.status, await response.json(), dict(response.headers)


async def end_all(session: aiohttp.ClientSession, cluster: Cluster, locations: list[str]) -> None:
    for location in locations:
        async with session.delete(cluster.balancer.url + location,
                                  headers=bearer(ADMIN)) as response:
            assert response.status == 200, await response.text()


def cluster_calls(cluster: Cluster) -> int:
    return sum(int(cluster.redis.command("ZCARD", f"agent:calls:{node.tag}"))
               for node in cluster.nodes)


async def wait_all_free(cluster: Cluster) -> None:
    for node in cluster.nodes:
        await asyncio.to_thread(wait_for, lambda n=node: n.health()["active_calls"] == 0, 15,
                                f"{node.host} free")
    # the heartbeats take the ended calls out of Redis too
    await asyncio.to_thread(wait_for, lambda: cluster_calls(cluster) == 0, 10, "redis free")


async def test_calls_through_the_balancer_are_controlled_on_their_owner(
        cluster: Cluster) -> None:
    """WebRTC calls made through HAProxy (round robin): every GET, PATCH and DELETE through
    it reaches the owner, wherever it lands; each answer carries the owner's candidates."""
    url = cluster.balancer.url
    hosts = {node.tag: node.host for node in cluster.nodes}
    async with aiohttp.ClientSession() as session:
        answers = [await post_offer(session, url, await offer_sdp_once(), bearer(KEYS[i % 4]))
                   for i in range(12)]
        locations = []
        for status, headers, sdp in answers:
            assert status == 201, sdp
            call_id = headers["Location"].rsplit("/", 1)[-1]
            owner = hosts[tag_of(call_id)]
            candidates = [line for line in sdp.splitlines() if line.startswith("a=candidate:")]
            assert candidates and all(f" {owner} " in line for line in candidates), sdp
            locations.append(headers["Location"])
        assert len({tag_of(location) for location in locations}) == 3  # spread over nodes
        for index, location in enumerate(locations):
            key = bearer(KEYS[index % 4])
            for _ in range(3):  # round robin: each lands on another node
                async with session.get(url + location, headers=key) as response:
                    assert response.status == 200, await response.text()
                    assert (await response.json())["id"] == location.rsplit("/", 1)[-1]
            async with session.patch(
                    url + location, data="a=end-of-candidates\r\n",
                    headers={**key, "Content-Type": "application/trickle-ice-sdpfrag"}
                    ) as response:
                assert response.status in (204, 400), await response.text()
            # another key's request for it: the owner's 404, as on one host
            async with session.get(url + location,
                                   headers=bearer(KEYS[(index + 1) % 4])) as response:
                assert response.status == 404
        for index, location in enumerate(locations):
            async with session.delete(url + location,
                                      headers=bearer(KEYS[index % 4])) as response:
                assert response.status == 200, await response.text()
        forwarded = 0.0
        for node in cluster.nodes:
            async with session.get(node.url + "/metrics", headers=bearer(ADMIN)) as response:
                text = await response.text()
            forwarded += sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                             if line.startswith("agent_cluster_forwarded_requests_total"))
        assert forwarded > 0
    await wait_all_free(cluster)


async def test_a_call_placed_on_another_node_carries_audio(cluster: Cluster) -> None:
    """A multipart offer (sdp + session) sent to a node that already holds a call is placed
    on an idle node and forwarded there whole; the media then flows with that node."""
    entry = cluster.nodes[0]
    async with aiohttp.ClientSession() as session:
        status, body, _ = await rtp(session, entry.url, KEYS[1])
        assert status == 201 and tag_of(body["call_id"]) == entry.tag
        busy = f"/v1/telephony/rtp/{body['call_id']}"
    client = RealtimeClient(entry.url, token=KEYS[0], seconds=10)
    try:
        await client.call(multipart=True, session={"instructions": "hi"})
        assert tag_of(client.call_id) != entry.tag
        await client.wait_audio(1.0)
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(cluster.balancer.url + str(client.location),
                                       headers=bearer(KEYS[0])) as response:
                    assert response.status == 200
            await end_all(session, cluster, [str(client.location), busy])
    finally:
        await client.close()
    await wait_all_free(cluster)


async def next_event(socket: aiohttp.ClientWebSocketResponse, kind: str) -> dict[str, Any]:
    """The next server event of type `kind` on a sideband (others are skipped)."""
    while True:
        message = await socket.receive(timeout=10)
        assert message.type == aiohttp.WSMsgType.TEXT, message
        event = json.loads(message.data)
        if event.get("type") == kind:
            return dict(event)


async def test_sidebands_reach_the_calls_owner_through_the_balancer(cluster: Cluster) -> None:
    """`GET /v1/realtime?call_id=ID` through HAProxy (round robin, so each lands on every
    node in turn) reaches the node that holds the call, whichever it is: session.created,
    a session.update round trip, and call.ending with a normal close when the call is hung
    up; another key's call and an unknown id on a live node are 404 before the upgrade."""
    url = cluster.balancer.url
    async with aiohttp.ClientSession() as session:
        calls: list[str] = []
        while len({tag_of(call) for call in calls}) < 3:  # placement spreads them
            status, body, _ = await rtp(session, url, KEYS[0])
            assert status == 201, body
            calls.append(body["call_id"])
            assert len(calls) <= 3 * CAPACITY
        entries: Counter[str] = Counter()
        for call in calls:
            for turn in range(3):
                async with session.ws_connect(f"{url}/v1/realtime?call_id={call}",
                                              headers=bearer(KEYS[0])) as socket:
                    assert (await next_event(socket, "session.created"))["type"]
                    await socket.send_json({"type": "session.update", "event_id": f"u{turn}",
                                            "session": {"instructions": "Be brief."}})
                    await next_event(socket, "session.updated")
        for node in cluster.nodes:  # every node relayed sidebands of other nodes' calls
            async with session.get(node.url + "/metrics", headers=bearer(ADMIN)) as response:
                for line in (await response.text()).splitlines():
                    if line.startswith('agent_cluster_forwarded_requests_total{kind="sideband"}'):
                        entries[node.tag] += int(float(line.split()[1]))
        assert len(entries) == 3 and all(entries.values()), entries
        for call in calls[:3]:
            for node in cluster.nodes:  # another key's call: 404 wherever it lands
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(f"{node.url}/v1/realtime?call_id={call}",
                                             headers=bearer(KEYS[1]))
                assert refused.value.status == 404
        unknown = "call_" + cluster.nodes[1].tag + "0" + "B" * 22
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(f"{cluster.nodes[0].url}/v1/realtime?call_id={unknown}",
                                     headers=bearer(KEYS[0]))
        assert refused.value.status == 404
        # a sideband held open on a node other than the owner ends with its call
        held = calls[-1]
        entry = next(node for node in cluster.nodes if node.tag != tag_of(held))
        async with session.ws_connect(f"{entry.url}/v1/realtime?call_id={held}",
                                      headers=bearer(ADMIN)) as socket:
            await next_event(socket, "session.created")
            async with session.delete(f"{url}/v1/telephony/rtp/{held}",
                                      headers=bearer(KEYS[0])) as response:
                assert response.status == 200, await response.text()
            assert (await next_event(socket, "call.ending"))["type"] == "call.ending"
            closing = await socket.receive(timeout=10)
            assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000, closing
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in calls[:-1]])
    await wait_all_free(cluster)


async def test_a_full_nodes_media_stream_goes_to_a_node_with_room(cluster: Cluster) -> None:
    """Media-stream websockets opened at one node fill it (they are admitted where they
    land); the next one opened there is carried to another node with room and carries audio
    there; with every node full, the node's own 503 before the upgrade."""
    entry = cluster.nodes[0]
    path = "/v1/telephony/media-stream"
    async with aiohttp.ClientSession() as session:
        streams = []
        try:
            for _ in range(CAPACITY):
                streams.append(await session.ws_connect(entry.url + path, headers=bearer(ADMIN)))
            await asyncio.to_thread(wait_for, lambda: entry.health()["active_calls"] == CAPACITY,
                                    10, "the entry node full")
            others = {node.tag: node.health()["active_calls"] for node in cluster.nodes[1:]}
            carried = await session.ws_connect(entry.url + path, headers=bearer(ADMIN))
            streams.append(carried)
            sid = "MZ" + "1" * 32
            await carried.send_json({"event": "connected", "protocol": "Call"})
            await carried.send_json({"event": "start", "streamSid": sid, "start": {
                "streamSid": sid, "mediaFormat": {"encoding": "audio/x-mulaw",
                                                  "sampleRate": 8000, "channels": 1}}})
            payload = base64.b64encode(bytes([0x7F]) * 160).decode()
            echoed = 0
            for chunk in range(50):
                await carried.send_json({"event": "media", "streamSid": sid, "media": {
                    "chunk": str(chunk + 1), "payload": payload}})
                await asyncio.sleep(0.02)
            while echoed == 0:
                message = await carried.receive(timeout=10)
                assert message.type == aiohttp.WSMsgType.TEXT, message
                echoed += json.loads(message.data).get("event") == "media"
            assert entry.health()["active_calls"] == CAPACITY
            now = {node.tag: node.health()["active_calls"] for node in cluster.nodes[1:]}
            assert sum(now.values()) == sum(others.values()) + 1, (others, now)
        finally:
            for stream in streams:
                await stream.close()
    await wait_all_free(cluster)


def test_the_node_table_shows_each_nodes_media_addresses(cluster: Cluster) -> None:
    """Each node's registry record carries where its media goes: /health's cluster view
    on any node lists every node's ICE host addresses, WebRTC ports and RTP bind (within a
    heartbeat of the nodes' start, when a node's record is still only its claim)."""
    def every_record_full(viewer: Node) -> bool:
        rows = viewer.health()["cluster"]["nodes"]
        return len(rows) == len(cluster.nodes) and all(row["media"] for row in rows)

    for viewer in cluster.nodes:
        wait_for(lambda v=viewer: every_record_full(v), 3, "every node's media record")
        rows = {row["node"]: row for row in viewer.health()["cluster"]["nodes"]}
        assert set(rows) == {node.tag for node in cluster.nodes}
        for node in cluster.nodes:
            media = rows[node.tag]["media"]
            assert media["ice_hosts"] == [node.host], media
            assert media["rtc"] == {"ports": None, "udp_port": None, "advertise": []}, media
            assert media["rtp"] == {"bind": "127.0.0.1", "advertise": "127.0.0.1",
                                    "ports": "40000-40999"}, media
    record = cluster.redis.command("HGET", f"agent:node:{cluster.nodes[0].tag}", "media")
    assert json.loads(record)["ice_hosts"] == [cluster.nodes[0].host]


async def test_bad_requests_at_the_cluster_layer_get_coded_errors(cluster: Cluster) -> None:
    """A forged node mark is 403; a body too large to forward is 413; an unknown id on a
    live node is that node's 404."""
    first, second = cluster.nodes[0], cluster.nodes[1]
    someone_elses = "/v1/realtime/calls/call_" + second.tag + "0" + "A" * 22
    async with aiohttp.ClientSession() as session:
        async with session.patch(first.url + someone_elses, data=b"a" * 300_000,
                                 headers={**bearer(KEYS[0]), "Content-Type":
                                          "application/trickle-ice-sdpfrag"}) as response:
            assert response.status == 413
            assert (await response.json())["error"]["code"] == "body_too_large"
        async with session.get(first.url + someone_elses, headers=bearer(KEYS[0])) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "call_not_found"
        # nothing is forwarded without a credential that can be good
        for headers in ({}, bearer("not-a-key")):
            async with session.get(first.url + someone_elses, headers=headers) as response:
                assert response.status == 401
        async with session.post(
                cluster.balancer.url + "/v1/telephony/rtp", json={"remote": "127.0.0.1:9"},
                headers={**bearer(KEYS[0]), "X-Agent-Node-Forwarded": cluster.nodes[0].tag,
                         "X-Agent-Node-Signature": "t=1,mac=00"}) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == "node_signature_invalid"


async def test_secrets_minted_at_one_node_are_redeemed_once_at_another(
        cluster: Cluster) -> None:
    first, second, third = cluster.nodes
    async with aiohttp.ClientSession() as session:
        async def mint(node_url: str) -> str:
            async with session.post(node_url + "/v1/realtime/client_secrets",
                                    headers=bearer(KEYS[1]), json={}) as response:
                assert response.status == 200, await response.text()
                return str((await response.json())["value"])

        made = []
        for _ in range(4):
            secrets = [await mint(first.url) for _ in range(3)]
            for value in secrets:
                # read with it anywhere before it is spent (the page's /v1/models)
                async with session.get(third.url + "/v1/models",
                                       headers=bearer(value)) as response:
                    assert response.status == 200, await response.text()
                status, headers, body = await post_offer(session, second.url,
                                                         await offer_sdp_once(), bearer(value))
                assert status == 201, body
                made.append(headers["Location"])
                # the secret manages its own call wherever the request lands
                async with session.get(cluster.balancer.url + headers["Location"],
                                       headers=bearer(value)) as response:
                    assert response.status == 200
                status, _, body = await post_offer(session, third.url, await offer_sdp_once(),
                                                   bearer(value))
                assert status == 401 and json.loads(body)["error"]["code"] == "secret_used"
            await end_all(session, cluster, made)
            made.clear()
        # races: the same secret redeemed at two nodes at once, exactly one winner each (two
        # races at a time: both racers take a slot of the key's 5 until one loses)
        for _ in range(6):
            secrets = [await mint(third.url) for _ in range(2)]
            offers = [await offer_sdp_once() for _ in range(4)]
            results = await asyncio.gather(*(
                post_offer(session, node.url, offers[2 * i + j], bearer(value))
                for i, value in enumerate(secrets) for j, node in enumerate((first, second))))
            for i in range(2):
                pair = sorted(results[2 * i][0:1] + results[2 * i + 1][0:1])
                assert pair == [201, 401], [result[0::2] for result in results]
            made = [headers["Location"] for status, headers, _ in results if status == 201]
            await end_all(session, cluster, made)
    await wait_all_free(cluster)


async def test_a_secret_spent_at_a_node_with_workers_leaves_no_unused_count_behind(
        cluster: Cluster) -> None:
    """The third node has two workers: a new call lands on either (a fresh connection each)
    and is made by the worker that minted its secret, whichever redeemed it in Redis.
    Afterwards no worker counts the spent secrets as unused: the key can still mint its full
    --max-secrets-per-key at that node, and the one past it is Redis's refusal. (Which worker
    accepts is the kernel's choice; test_secrets.py takes the crossing path every time.)"""
    third = cluster.nodes[2]
    await wait_all_free(cluster)
    connector = aiohttp.TCPConnector(force_close=True)  # each request its own connection
    async with aiohttp.ClientSession(connector=connector) as session:
        async def mint() -> tuple[int, dict[str, Any]]:
            async with session.post(third.url + "/v1/realtime/client_secrets",
                                    headers=bearer(KEYS[3]), json={}) as response:
                return response.status, await response.json()

        for _ in range(3):
            # minted at once (by either worker), each then used at the same node (an idle
            # cluster places a call on the node it reaches)
            minted = await asyncio.gather(mint(), mint())
            for status, body in minted:
                assert status == 200, body
                status, headers, answer = await post_offer(
                    session, third.url, await offer_sdp_once(), bearer(body["value"]))
                assert status == 201, answer
                assert tag_of(headers["Location"].rsplit("/", 1)[-1]) == third.tag
                await end_all(session, cluster, [headers["Location"]])
        await wait_all_free(cluster)
        for _ in range(3):
            status, body = await mint()
            assert status == 200, body
        status, body = await mint()
        assert status == 429 and body["error"]["code"] == "too_many_secrets", body
        assert "across the cluster" in body["error"]["message"], body


async def test_max_secrets_per_key_is_the_clusters(cluster: Cluster) -> None:
    """--max-secrets-per-key 3: three unused secrets minted at three nodes fill the key's
    share of the whole cluster; redeeming one makes room again."""
    async with aiohttp.ClientSession() as session:
        async def mint(node_url: str) -> tuple[int, dict[str, Any]]:
            async with session.post(node_url + "/v1/realtime/client_secrets",
                                    headers=bearer(KEYS[2]), json={}) as response:
                return response.status, await response.json()

        values = []
        for node in cluster.nodes:
            status, body = await mint(node.url)
            assert status == 200, body
            values.append(body["value"])
        for node in cluster.nodes:
            status, body = await mint(node.url)
            assert status == 429 and body["error"]["code"] == "too_many_secrets", body
        status, headers, answer = await post_offer(session, cluster.nodes[0].url,
                                                   await offer_sdp_once(), bearer(values[1]))
        assert status == 201, answer
        status, body = await mint(cluster.nodes[2].url)
        assert status == 200, body
        await end_all(session, cluster, [headers["Location"]])
    await wait_all_free(cluster)


async def test_a_burst_admits_exactly_the_clusters_capacity(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(rtp(session, cluster.balancer.url, KEYS[i % 4])
                                         for i in range(16)))
        statuses = Counter(status for status, _, _ in answers)
        assert statuses == {201: 12, 503: 4}, answers
        assert {body["error"]["code"] for status, body, _ in answers if status == 503} == {
            "server_full"}
        admitted = [body["call_id"] for status, body, _ in answers if status == 201]
        assert Counter(tag_of(call) for call in admitted) == {n.tag: 4 for n in cluster.nodes}
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in admitted])
    await wait_all_free(cluster)


async def test_max_calls_per_key_is_exact_across_the_cluster(cluster: Cluster) -> None:
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(rtp(session, cluster.balancer.url, KEYS[0])
                                         for _ in range(8)))
        assert Counter(status for status, _, _ in answers) == {201: PER_KEY, 429: 3}, answers
        refused = [(body, headers) for status, body, headers in answers if status == 429]
        assert all(body["error"]["code"] == "tenant_limit" and "Retry-After" in headers
                   for body, headers in refused)
        # another key still has room
        status, body, _ = await rtp(session, cluster.balancer.url, KEYS[1])
        assert status == 201, body
        admitted = [b["call_id"] for s, b, _ in answers if s == 201] + [body["call_id"]]
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in admitted])
    await wait_all_free(cluster)


async def test_calls_outlive_redis_paused_and_restarted(cluster: Cluster) -> None:
    url = cluster.balancer.url
    async with aiohttp.ClientSession() as session:
        before = [(await rtp(session, url, KEYS[i % 4]))[1]["call_id"] for i in range(3)]
        assert cluster.redis.process is not None
        os.kill(cluster.redis.process.pid, signal.SIGSTOP)  # paused: commands time out
        try:
            for call in before:
                started = time.monotonic()
                async with session.get(f"{url}/v1/telephony/rtp/{call}",
                                       headers=bearer(ADMIN)) as response:
                    assert response.status == 200
                assert time.monotonic() - started < 3
            for node in cluster.nodes:
                assert node.ready() == 200
        finally:
            os.kill(cluster.redis.process.pid, signal.SIGCONT)
        cluster.redis.stop()  # stopped: its data is gone with it
        await asyncio.sleep(0.5)
        during = [(await rtp(session, url, KEYS[i % 4]))[1].get("call_id") for i in range(3)]
        assert all(during)  # each node admits by its own capacity meanwhile
        for node in cluster.nodes:
            assert node.ready() == 200
        await asyncio.to_thread(
            wait_for, lambda: all(not n.health()["cluster"]["redis_reachable"]
                                  for n in cluster.nodes), 10, "nodes see Redis down")
        cluster.redis.start()  # the same port, empty
        back = time.monotonic()
        await asyncio.to_thread(
            wait_for, lambda: len(cluster.redis.keys("agent:node:*")) == 3, 5,
            "registry whole again")
        assert time.monotonic() - back <= 2.0 + 1.0  # one heartbeat (and the loaded machine)
        await asyncio.to_thread(wait_for, lambda: cluster_calls(cluster) == 6, 5,
                                "every live call counted again")
        for call in before + during:
            async with session.get(f"{url}/v1/telephony/rtp/{call}",
                                   headers=bearer(ADMIN)) as response:
                assert response.status == 200
        logs = "".join(node.log() for node in cluster.nodes)
        # one line per change of state per process, not one per request
        assert 3 <= logs.count("cluster store unreachable") <= 8
        async with session.get(cluster.nodes[0].url + "/metrics",
                               headers=bearer(ADMIN)) as response:
            metrics = await response.text()
        assert any(line.startswith("agent_cluster_redis_errors_total ")
                   and float(line.split()[1]) > 0 for line in metrics.splitlines())
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in before + during])
    await wait_all_free(cluster)


async def test_a_killed_nodes_keys_vanish_and_its_calls_answer_404(cluster: Cluster) -> None:
    """SIGKILL of one node: its keys are gone within one TTL (+ 0.5 s), controls of its
    calls answer 404 `call_not_found` within 7 s, and the RTP calls on the other nodes keep
    their audio across the kill: no packet missing, none late (LATE_S behind)."""
    url = cluster.balancer.url
    victim = cluster.nodes[1]
    callers: dict[str, RtpCaller] = {}
    async with aiohttp.ClientSession() as session:
        calls: list[str] = []
        while (not any(tag_of(c) == victim.tag for c in calls)
               or sum(tag_of(c) != victim.tag for c in calls) < 4):
            caller = await RtpCaller.open()
            async with session.post(url + "/v1/telephony/rtp", headers=bearer(
                    KEYS[len(calls) % 4]), json={
                    "remote": caller.address, "codec": "PCMU"}) as response:
                body = await response.json()
                assert response.status == 201, body
            caller.start(body["local"])
            callers[body["call_id"]] = caller
            calls.append(body["call_id"])
            assert len(calls) <= 2 * CAPACITY
        survivors = [callers[c] for c in calls if tag_of(c) != victim.tag]
        await asyncio.sleep(1.0)  # the echo flows
        assert all(caller.arrivals for caller in survivors)
        theirs = next(c for c in calls if tag_of(c) == victim.tag)
        victim.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.to_thread(victim.process.wait, 5)

        def gone() -> bool:
            return not cluster.redis.keys(f"agent:*:{victim.tag}")
        await asyncio.to_thread(wait_for, gone, TTL_S + 2, "the killed node's keys")
        assert time.monotonic() - killed <= TTL_S + 0.5

        async def its_call() -> int:
            async with session.get(f"{url}/v1/telephony/rtp/{theirs}",
                                   headers=bearer(ADMIN)) as response:
                if response.status == 404:
                    assert (await response.json())["error"]["code"] == "call_not_found"
                return response.status
        assert await its_call() == 404
        assert time.monotonic() - killed <= 7.0
        for call in calls:
            if call != theirs and tag_of(call) != victim.tag:
                async with session.get(f"{url}/v1/telephony/rtp/{call}",
                                       headers=bearer(ADMIN)) as response:
                    assert response.status == 200
        across = time.monotonic()
        counts = [caller.counted(killed - 0.5, across, LATE_S) for caller in survivors]
        for caller in callers.values():
            await caller.stop()
        # each surviving call's echo went on through the kill, whole and on time
        assert all(packets >= (across - killed) / 0.02 * 0.8 for packets, _, _ in counts), counts
        assert [(missing, late) for _, missing, late in counts] == [(0, 0)] * len(counts), counts
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in calls
                                         if tag_of(c) != victim.tag])
    cluster.nodes.remove(victim)


async def test_a_draining_node_gets_no_new_calls_and_keeps_its_own(cluster: Cluster) -> None:
    url = cluster.balancer.url
    drained, other = cluster.nodes[0], cluster.nodes[1]
    async with aiohttp.ClientSession() as session:
        status, body, _ = await rtp(session, drained.url, KEYS[0])
        assert status == 201 and tag_of(body["call_id"]) == drained.tag, body
        held = body["call_id"]
        async with session.post(drained.url + "/admin/drain", headers=bearer(ADMIN)) as answer:
            assert answer.status == 202
        assert drained.ready() == 503
        made = []
        for i in range(CAPACITY):  # the other node's capacity; half reach the drained first
            status, body, _ = await rtp(session, (drained.url, url)[i % 2], KEYS[i % 4])
            assert status == 201, body
            made.append(body["call_id"])
        assert all(tag_of(call) == other.tag for call in made)
        for _ in range(3):  # its own call stays controllable from anywhere
            async with session.get(f"{other.url}/v1/telephony/rtp/{held}",
                                   headers=bearer(ADMIN)) as response:
                assert response.status == 200
        await end_all(session, cluster, [f"/v1/telephony/rtp/{c}" for c in made + [held]])
        # drained: it exits, and takes its keys with it
        await asyncio.to_thread(drained.process.wait, 20)
        assert not cluster.redis.keys(f"agent:node:{drained.tag}")
