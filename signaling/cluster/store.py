"""The cluster's one connection to Redis (redis-py's asyncio client) and whether it works.

Every call into Redis goes through `Store.run`: short timeouts (a Redis paused with SIGSTOP
must not hold a request for long), no retries (the caller falls back instead), an error
counter for /metrics, and one log line when Redis stops or starts answering, never one per
request. While Redis is down only the heartbeat tries it (`usable` is False): requests fall
back at once instead of each waiting out a timeout.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from agent.errors import AgentError
from signaling.cluster import scripts

log = logging.getLogger(__name__)

TIMEOUT_S = 0.5  # per command: a paused Redis costs a request this long at most, once


class StoreDown(AgentError):
    """Redis did not answer (or answered with an error)."""

    def __init__(self, message: str) -> None:
        super().__init__("store_down", message, status=503)


class Store:
    def __init__(self, url: str, prefix: str) -> None:
        self.prefix = prefix
        self.client = aioredis.Redis.from_url(
            url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
        self._scripts = {name: self.client.register_script(getattr(scripts, name))
                         for name in ("SYNC", "PLACE", "SETTLE", "MINT", "SECRET")}
        self.reachable = True  # as last seen; logged when it changes
        self.errors = 0  # Redis errors since start (/metrics)
        self.round_trips = 0  # commands sent (benchmarks: round trips per call set-up)
        self.down_since: float | None = None
        self.on_error: Callable[[], None] | None = None

    @property
    def usable(self) -> bool:
        """Worth asking from a request (the heartbeat asks regardless)."""
        return self.reachable

    def _went(self, reachable: bool, why: str = "") -> None:
        if reachable == self.reachable:
            return
        self.reachable = reachable
        if reachable:
            log.warning("cluster store reachable again after %.1f s",
                        time.monotonic() - (self.down_since or time.monotonic()))
            self.down_since = None
        else:
            self.down_since = time.monotonic()
            log.warning("cluster store unreachable (%s): live calls go on; admission falls "
                        "back to this node's own capacity", why)

    async def run(self, script: str, **argument: Any) -> Any:
        """Run one of scripts.py's scripts with `argument` (the prefix added); its decoded
        JSON answer. StoreDown when Redis does not answer."""
        argument["prefix"] = self.prefix
        self.round_trips += 1
        try:
            answer = await self._scripts[script](args=[json.dumps(argument)])
        except (RedisError, OSError) as exc:
            self._failed(exc)
            raise StoreDown(str(exc)) from None
        self._went(True)
        return json.loads(answer)

    async def first_use(self, key: str, keep_ms: int) -> bool | None:
        """`key` (the prefix added) set where absent, kept `keep_ms`: True the first time,
        False while it is kept, None when Redis is not usable or does not answer (a node's
        request nonce, signing.py)."""
        if not self.usable:
            return None
        self.round_trips += 1
        try:
            stored = await self.client.set(self.prefix + key, b"1", nx=True, px=keep_ms)
        except (RedisError, OSError) as exc:
            self._failed(exc)
            return None
        self._went(True)
        return bool(stored)

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        if self.on_error is not None:
            self.on_error()
        self._went(False, type(exc).__name__)

    async def close(self) -> None:
        await self.client.aclose()
