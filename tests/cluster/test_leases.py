"""Upstream seat leases (signaling/cluster/leases.py) with the remote plugins' lease
protocol (agent/plugins/remote/seats.py): two servers' plugins sharing one single-call fake
Moshi engine through a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.plugins.base import PluginError
from agent.plugins.remote.link import LinkSettings
from agent.plugins.remote.moshi_server import MoshiServerPlugin
from signaling.cluster import leases
from signaling.cluster.leases import RedisSeats
from signaling.cluster.store import Store
from tests.cluster.support import Redis
from tests.remote.driver import Driver, failed_with
from tests.support.agents import wait_until
from tests.support.fake_engines import Behaviour, FakeMoshi

pytestmark = pytest.mark.interop  # a real redis-server

FAST = LinkSettings(connect_timeout=2.0, handshake_timeout=2.0, stall_timeout=5.0)


@pytest.fixture
async def fake() -> AsyncIterator[FakeMoshi]:
    engine = await FakeMoshi().start()
    yield engine
    await engine.kill()


async def server_plugin(redis: Redis, fake: FakeMoshi) -> tuple[Driver, Store]:
    """One server's moshi-server plugin (one call per upstream) with the cluster's seats."""
    store = Store(redis.url, "agent:")
    plugin = MoshiServerPlugin([fake.url], settings=FAST)
    plugin.use_seat_leases(RedisSeats(store))
    return Driver(plugin), store


async def test_one_seat_is_held_by_one_server_at_a_time(redis: Redis, fake: FakeMoshi) -> None:
    (first, first_store), (second, second_store) = [await server_plugin(redis, fake)
                                                    for _ in range(2)]
    try:
        held = await first.open()
        with pytest.raises(PluginError) as refused:
            await second.open()
        assert (refused.value.code, refused.value.status) == ("upstreams_full", 503)
        assert fake.active == 1
        seat = redis.keys("agent:seat:*")
        assert len(seat) == 1
        await first.close(held)
        await wait_until(lambda: not redis.keys("agent:seat:*"), timeout=5)  # released
        second.plugin.pool.upstreams[0].skip_until = 0.0  # past its full cool-down
        taken = await second.open()
        assert fake.active == 1 and len(redis.keys("agent:seat:*")) == 1
        await second.close(taken)
    finally:
        for driver, store in ((first, first_store), (second, second_store)):
            await driver.shutdown()
            await store.close()


async def test_a_lost_seat_ends_its_session_with_a_code(
        redis: Redis, fake: FakeMoshi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases, "RENEW_S", 0.1)
    driver, store = await server_plugin(redis, fake)
    try:
        session = await driver.open()
        (key,) = redis.keys("agent:seat:*")
        redis.command("SET", key, "another-server")  # its hold expired and was taken
        outputs = await driver.run_until(session, lambda out: failed_with(out) is not None)
        failure = failed_with(outputs)
        assert failure is not None and failure.error is not None
        assert failure.error.code == "upstream_lease_lost" and failure.end_call
        assert redis.command("GET", key) == "another-server"  # not deleted by the loser
        await driver.close(session)
    finally:
        await driver.shutdown()
        await store.close()


async def test_a_new_call_needs_the_shared_store(redis: Redis, fake: FakeMoshi) -> None:
    driver, store = await server_plugin(redis, fake)
    try:
        redis.stop()
        with pytest.raises(PluginError) as refused:
            await driver.open()
        assert (refused.value.code, refused.value.status) == ("seats_unavailable", 503)
        await asyncio.sleep(0)
        assert fake.active == 0
    finally:
        await driver.shutdown()
        await store.close()


async def test_two_single_call_engines_shared_by_three_servers(
        redis: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten calls at once from three servers onto two one-call engines: exactly two are
    made, and no engine is ever asked for a second session. A server that dies holding a
    seat (no release, no renewal) keeps it until the lease's TTL, and not after."""
    monkeypatch.setattr(leases, "TTL_MS", 1500)
    fakes = [await FakeMoshi(Behaviour(capacity=1)).start() for _ in range(2)]
    servers = []
    for _ in range(3):
        store = Store(redis.url, "agent:")
        plugin = MoshiServerPlugin([f.url for f in fakes], settings=FAST)
        plugin.use_seat_leases(RedisSeats(store))
        servers.append((Driver(plugin), store))
    try:
        results = await asyncio.gather(*(servers[i % 3][0].open() for i in range(10)),
                                       return_exceptions=True)
        made = [(i % 3, r) for i, r in enumerate(results) if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, PluginError)]
        assert len(made) == 2 and len(refused) == 8, results
        assert {r.code for r in refused} == {"upstreams_full"}
        assert [f.active for f in fakes] == [1, 1] and [f.refused for f in fakes] == [0, 0]
        # the first holder dies: its renewals stop and it never releases
        dead_index, dead_session = made[0]
        dead = servers[dead_index][0].plugin
        hold = dead._holds.pop(dead_session.link)
        hold.task.cancel()
        await servers[dead_index][0].close(dead_session)  # its engine session ends with it
        await wait_until(lambda: sum(f.active for f in fakes) == 1, timeout=5)
        other = servers[(dead_index + 1) % 3][0]

        async def try_open() -> object:
            for upstream in other.plugin.pool.upstreams:
                upstream.skip_until = 0.0  # past the full cool-down
            try:
                return await other.open()
            except PluginError as exc:
                return exc

        early = await try_open()
        assert isinstance(early, PluginError) and early.code == "upstreams_full"
        await asyncio.sleep(1.6)  # the lease's TTL
        later = await try_open()
        assert not isinstance(later, PluginError), later
        assert [f.refused for f in fakes] == [0, 0]
        await other.close(later)  # type: ignore[arg-type]
        for index, session in made[1:]:
            await servers[index][0].close(session)
    finally:
        for driver, store in servers:
            await driver.shutdown()
            await store.close()
        for fake_engine in fakes:
            await fake_engine.kill()
