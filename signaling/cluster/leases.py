"""Upstream seat leases in Redis (agent/plugins/remote/seats.py's `SeatLeases`): a remote
plugin's session holds one seat of its upstream in the whole cluster.

A seat is a key `P seat:{sha256(url)}:{n}` set if absent with the holder's random value and
a TTL (`SET NX PX`), renewed every `RENEW_S` only while it still holds that value (Lua:
compare and expire), and released by compare-and-delete, so a holder never renews or frees
a seat someone else took after its own hold expired. A renewal that finds another value
means the hold was lost: its session ends (`upstream_lease_lost`). Redis not answering a
renewal is not a loss (no other node can take the seat either); a Redis that comes back
empty gets the seat written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from agent.plugins.remote.seats import SeatsUnavailable
from signaling.cluster.store import Store

log = logging.getLogger(__name__)

TTL_MS = 6000
RENEW_S = 2.0

RENEW = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not held then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisSeatHold:
    def __init__(self, seats: RedisSeats, key: str, value: str,
                 on_lost: Callable[[], None]) -> None:
        self.seats, self.key, self.value, self.on_lost = seats, key, value, on_lost
        self.task: asyncio.Task[None] = asyncio.get_running_loop().create_task(
            self._renew(), name=f"seat:{key}")
        self.released = False

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                kept = await self.seats.store.client.eval(RENEW, 1, self.key, self.value,
                                                          TTL_MS)
            except (RedisError, OSError):
                continue  # nobody else can take it meanwhile either
            if not kept:
                log.warning("upstream seat %s was taken by another node: ending its session",
                            self.key)
                self.on_lost()
                return

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.task.cancel()
        self.seats.spawn(self._release())

    async def _release(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        with contextlib.suppress(RedisError, OSError):
            await self.seats.store.client.eval(RELEASE, 1, self.key, self.value)


class RedisSeats:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._tasks: set[asyncio.Task[None]] = set()

    def key(self, upstream: str, seat: int) -> str:
        digest = hashlib.sha256(upstream.encode()).hexdigest()[:24]
        return f"{self.store.prefix}seat:{digest}:{seat}"

    async def hold(self, upstream: str, seats: int, on_lost: Callable[[], None]
                   ) -> RedisSeatHold | None:
        value = secrets.token_hex(12)
        for seat in range(seats):
            key = self.key(upstream, seat)
            try:
                taken = await self.store.client.set(key, value, nx=True, px=TTL_MS)
            except (RedisError, OSError):
                raise SeatsUnavailable("this engine's seats are kept in the cluster's shared "
                                       "store, which is unreachable; retry shortly") from None
            if taken:
                return RedisSeatHold(self, key, value, on_lost)
        return None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
