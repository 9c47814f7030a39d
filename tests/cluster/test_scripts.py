"""The cluster's Lua scripts (signaling/cluster/scripts.py) against a real redis-server:
placement is exact under a concurrent burst, a key's limit holds, a secret is redeemed
exactly once, and a node that stops beating vanishes with its calls after its TTL."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.worker_tag import TAGS
from signaling.cluster.store import Store
from tests.cluster.support import Redis

pytestmark = pytest.mark.interop  # a real redis-server

TTL = 6000


@pytest.fixture
async def stores(redis: Redis) -> AsyncIterator[list[Store]]:
    """Three clients, as three nodes have."""
    made = [Store(redis.url, "agent:") for _ in range(3)]
    yield made
    for store in made:
        await store.close()


async def beat(store: Store, tag: str, capacity: int, state: str = "serving",
               ttl: int = TTL) -> Any:
    return await store.run("SYNC", node=tag, ttl=ttl, tags=TAGS, add=[], remove=[],
                           record={"address": f"http://{tag}", "state": state,
                                   "capacity": capacity, "workers": 1})


async def place(store: Store, entry: str, member: str, tenant: str = "t",
                limit: int = 0) -> list[str]:
    return list(await store.run("PLACE", tags=TAGS, entry=entry, member=member, hold=30_000,
                                tenant=tenant, tenant_limit=limit, ttl=TTL))


async def test_a_burst_places_exactly_the_sum_of_capacities(stores: list[Store]) -> None:
    for store, tag in zip(stores, "abc", strict=True):
        await beat(store, tag, 8)
    answers = await asyncio.gather(*(place(stores[i % 3], "abc"[i % 3], f"r:{i}")
                                     for i in range(40)))
    placed = Counter(answer[1] for answer in answers if answer[0] == "placed")
    assert placed == {"a": 8, "b": 8, "c": 8}
    assert sum(1 for answer in answers if answer[0] == "full") == 16
    table = {row[0]: row[4] for row in await beat(stores[0], "a", 8)}
    assert table == {"a": 8, "b": 8, "c": 8}


async def test_least_loaded_first_and_never_a_draining_node(stores: list[Store]) -> None:
    await beat(stores[0], "a", 4)
    await beat(stores[1], "b", 4)
    await beat(stores[2], "c", 4, state="draining")
    first = await place(stores[0], "a", "r:1")
    assert first == ["placed", "a"]  # a tie goes to the node asked
    second = await place(stores[0], "a", "r:2")
    assert second == ["placed", "b"]  # then the lighter one
    rest = [await place(stores[0], "a", f"r:{i}") for i in range(3, 10)]
    assert all(answer[0] == "full" or answer[1] != "c" for answer in rest)


async def test_a_keys_limit_holds_under_a_burst(stores: list[Store]) -> None:
    await beat(stores[0], "a", 0)  # no capacity limit: only the key's
    answers = await asyncio.gather(*(place(stores[i % 3], "a", f"r:{i}", "k", 5)
                                     for i in range(12)))
    assert Counter(answer[0] for answer in answers) == {"placed": 5, "tenant_limit": 7}
    # a slot given back (the call was not made) is free again, and only that one
    given_back = next(f"r:{i}" for i, answer in enumerate(answers) if answer[0] == "placed")
    await stores[0].run("SETTLE", node="a", owner="a", member=given_back, call="", tenant="k",
                        ttl=TTL)
    assert await place(stores[1], "a", "r:new", "k", 5) == ["placed", "a"]
    assert (await place(stores[2], "a", "r:newer", "k", 5))[0] == "tenant_limit"


async def test_a_settled_slot_becomes_the_call(stores: list[Store], redis: Redis) -> None:
    await beat(stores[0], "a", 2)
    assert await place(stores[0], "a", "r:1", "k") == ["placed", "a"]
    await stores[0].run("SETTLE", node="a", owner="a", member="r:1", call="call_a0x",
                        tenant="k", ttl=TTL)
    assert redis.command("ZRANGE", "agent:calls:a", "0", "-1") == ["call_a0x"]
    assert redis.command("ZRANGE", "agent:tenant:k", "0", "-1") == ["call_a0x"]
    # the node's heartbeat takes an ended call out
    await stores[0].run("SYNC", node="a", ttl=TTL, tags=TAGS, add=[],
                        remove=[["call_a0x", "k"]],
                        record={"address": "http://a", "state": "serving", "capacity": 2,
                                "workers": 1})
    assert redis.command("ZCARD", "agent:calls:a") == 0
    assert redis.command("ZCARD", "agent:tenant:k") == 0


async def test_a_node_that_stops_beating_vanishes_with_its_calls(
        stores: list[Store], redis: Redis) -> None:
    await beat(stores[0], "a", 4, ttl=400)
    await stores[0].run("SYNC", node="a", ttl=400, tags=TAGS, add=[["call_a0y", "k"]],
                        remove=[], record={"address": "http://a", "state": "serving",
                                           "capacity": 4, "workers": 1})
    assert redis.keys("agent:*") == ["agent:calls:a", "agent:node:a", "agent:tenant:k"]
    await asyncio.sleep(0.6)
    assert redis.keys("agent:*") == []
    assert await place(stores[1], "b", "r:1") == ["full"]  # no node left


async def test_a_secret_is_redeemed_exactly_once(stores: list[Store]) -> None:
    expires = 2_000_000_000_000

    async def mint(name: str) -> str:
        answer = await stores[0].run("MINT", hash=name, tenant="k", limit=2, expires=expires,
                                     session="{}")
        return str(answer[0])

    assert [await mint("h1"), await mint("h2"), await mint("h3")] == [
        "minted", "minted", "too_many_secrets"]
    answers = await asyncio.gather(*(stores[i % 3].run("SECRET", op="redeem", hash="h1")
                                     for i in range(30)))
    assert Counter(answer[0] for answer in answers) == {"unused": 1, "used": 29}
    assert await mint("h3") == "minted"  # a redeemed secret no longer counts as unused
    await stores[1].run("SECRET", op="release", hash="h1")  # its call could not be made
    assert (await stores[2].run("SECRET", op="redeem", hash="h1"))[0] == "unused"
    assert (await stores[2].run("SECRET", op="peek", hash="nope"))[0] == "unknown"
