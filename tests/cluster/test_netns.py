"""The cluster with each node in a network namespace of its own (ip netns, veth pairs on a
bridge made by the fixture), the third with `--workers 2`; redis-server and HAProxy stay in
the test's namespace and reach the nodes over the bridge. The same requests as on 127.0.0.x
(test_cluster.py), where no node shares another's loopback or ports: every node listens on
port 8080 of its own address."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import aiohttp
import pytest

from tests.cluster.support import Cluster, network_namespaces, running_cluster, wait_for
from tests.cluster.test_cluster import ADMIN, COMMON, KEYS, TTL_S, bearer, post_offer, rtp, tag_of
from tests.support.realtime import offer_sdp_once

pytestmark = [pytest.mark.interop, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("netns")
    with network_namespaces(3) as (bridge, spaces):
        names = tuple(name for name, _ in spaces)
        hosts = tuple(address for _, address in spaces)
        with running_cluster(folder, (COMMON, COMMON, (*COMMON, "--workers", "2")), hosts,
                             names, redis_bind=bridge) as running:
            yield running


async def test_calls_in_namespaces_are_placed_and_controlled_through_the_balancer(
        cluster: Cluster) -> None:
    url = cluster.balancer.url
    hosts = {node.tag: node.host for node in cluster.nodes}
    assert all(node.port == 8080 for node in cluster.nodes)
    async with aiohttp.ClientSession() as session:
        calls = []
        for index in range(6):
            status, headers, sdp = await post_offer(session, url, await offer_sdp_once(),
                                                    bearer(KEYS[index % 4]))
            assert status == 201, sdp
            location = headers["Location"]
            owner = hosts[tag_of(location)]
            candidates = [line for line in sdp.splitlines() if line.startswith("a=candidate:")]
            assert candidates and all(f" {owner} " in line for line in candidates), sdp
            calls.append((location, KEYS[index % 4]))
        assert len({tag_of(location) for location, _ in calls}) == 3
        for location, key in calls:
            for _ in range(3):
                async with session.get(url + location, headers=bearer(key)) as response:
                    assert response.status == 200, await response.text()
            async with session.delete(url + location, headers=bearer(key)) as response:
                assert response.status == 200, await response.text()


async def test_a_killed_namespaced_nodes_keys_vanish_and_its_calls_answer_404(
        cluster: Cluster) -> None:
    url = cluster.balancer.url
    victim = cluster.nodes[1]
    async with aiohttp.ClientSession() as session:
        status, body, _ = await rtp(session, victim.url, KEYS[0])
        assert status == 201 and tag_of(body["call_id"]) == victim.tag
        theirs = body["call_id"]
        victim.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.process.wait(5)
        await asyncio.to_thread(wait_for, lambda: not cluster.redis.keys(f"agent:*:{victim.tag}"),
                                TTL_S + 2, "the killed node's keys")
        assert time.monotonic() - killed <= TTL_S + 0.5
        async with session.get(f"{url}/v1/telephony/rtp/{theirs}",
                               headers=bearer(ADMIN)) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "call_not_found"
