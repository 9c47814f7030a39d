"""Upstream seats with real node processes: two single-call fake engines (FakeMoshi with
capacity 1, which counts every session it is asked for beyond that as refused) shared by
three `python -m signaling --cluster ... --plugin moshi-server` nodes behind HAProxy.

Ten calls at once through the balancer make exactly two calls, and no engine is ever asked
for a second session; a node SIGKILLed while it holds a seat keeps it (in Redis) until the
lease's TTL runs out, and a new call gets it after that and not before.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from signaling.cluster import leases
from tests.cluster.support import Cluster, running_cluster, wait_for
from tests.support.fake_engines import Behaviour, FakeMoshi, FakeServer

pytestmark = [pytest.mark.interop, pytest.mark.slow]

KEY = "key-seats-0001"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
async def fakes() -> AsyncIterator[list[FakeServer]]:
    engines = [await FakeMoshi(Behaviour(capacity=1)).start() for _ in range(2)]
    yield engines
    for engine in engines:
        await engine.kill()


def tag_of(call_id: str) -> str:
    return call_id[-24]


async def rtp_call(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object]]:
    async with session.post(url + "/v1/telephony/rtp", headers=HEADERS,
                            json={"remote": "127.0.0.1:9", "codec": "PCMU"}) as response:
        return response.status, json.loads(await response.read() or b"{}")


def seat_keys(cluster: Cluster) -> list[str]:
    return cluster.redis.keys("agent:seat:*")


def seat_key(upstream: str) -> str:
    """The key of an upstream's only seat, as signaling/cluster/leases.py names it (read
    here on its own, so the test checks the name too)."""
    return f"agent:seat:{hashlib.sha256(upstream.encode()).hexdigest()[:24]}:0"


async def test_two_single_call_engines_shared_by_three_node_processes(
        fakes: list[FakeServer], tmp_path_factory: pytest.TempPathFactory) -> None:
    flags = ("--plugin", "moshi-server", "--api-key", KEY, "--drain-seconds", "1",
             *[flag for fake in fakes for flag in ("--upstream", fake.url)])
    folder = tmp_path_factory.mktemp("seats")
    with running_cluster(folder, (flags, flags, flags)) as cluster:
        url = cluster.balancer.url
        peaks = [0, 0]

        async def watch() -> None:
            while True:
                for index, fake in enumerate(fakes):
                    peaks[index] = max(peaks[index], fake.active)
                await asyncio.sleep(0.01)

        watcher = asyncio.ensure_future(watch())
        try:
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(rtp_call(session, url) for _ in range(10)))
                made = [body for status, body in results if status == 201]
                refused = [body for status, body in results if status != 201]
                assert len(made) == 2, results
                # refused by the seats, or by placement (each node counts its engines'
                # seats as its capacity, so the cluster's sum is more than the two seats)
                codes = {r["error"]["code"] for r in refused}  # type: ignore[index]
                assert "upstreams_full" in codes and codes <= {"upstreams_full",
                                                               "server_full"}, refused
                assert [fake.active for fake in fakes] == [1, 1]
                # sampled here too: a session that began after the watcher's last look may
                # end (its node killed below) before the watcher looks again
                peaks[:] = [max(peak, fake.active) for peak, fake in zip(peaks, fakes, strict=True)]
                assert seat_keys(cluster) == sorted(seat_key(fake.url) for fake in fakes)

                # the node holding the first call dies: no release, no renewal
                victim = cluster.node_of(tag_of(str(made[0]["call_id"])))
                # placement may have put both calls there: the other's call lives on
                alive = [call for call in made if tag_of(str(call["call_id"])) != victim.tag]
                victim.process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(victim.process.wait, 5)
                killed = time.monotonic()
                cluster.nodes.remove(victim)
                # its engine session ends with its connection; its seat does not
                await asyncio.to_thread(
                    wait_for, lambda: sum(f.active for f in fakes) == len(alive), 5,
                    "the dead node's engine sessions to end")
                dead_seats = [seat_key(fake.url) for fake in fakes if fake.active == 0]
                # the first of the dead node's seats to come free
                left_ms = min(int(cluster.redis.command("PTTL", key)) for key in dead_seats)
                expires = time.monotonic() + left_ms / 1000
                assert 0 < left_ms <= leases.TTL_MS
                assert time.monotonic() - killed < leases.TTL_MS / 1000

                survivor = cluster.nodes[0]
                early = []
                while True:  # a new call to a surviving node, again and again
                    tried = time.monotonic()
                    status, body = await rtp_call(session, survivor.url)
                    answered = time.monotonic()
                    if status == 201:
                        break
                    assert body["error"]["code"] == "upstreams_full", body  # type: ignore[index]
                    early.append(tried)
                    assert tried < expires + 5.0, "the seat was not taken again"
                    await asyncio.sleep(0.2)
                # taken again only once the dead node's lease ran out (`expires` was read
                # a moment after Redis's own PTTL: that moment is the slack)
                assert answered >= expires - 0.1, (answered, expires)
                assert early and min(early) < expires
                assert sum(fake.active for fake in fakes) == len(alive) + 1
                for call in (*alive, body):
                    call_id = str(call["call_id"])
                    async with session.delete(f"{url}/v1/telephony/rtp/{call_id}",
                                              headers=HEADERS) as response:
                        assert response.status == 200, await response.text()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        assert peaks == [1, 1]  # never two sessions on a one-call engine ...
        assert [fake.refused for fake in fakes] == [0, 0]  # ... nor a second one asked for
