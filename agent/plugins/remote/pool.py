"""A pool of remote model servers: pick the least-loaded healthy one for each new call.

Each upstream has a capacity (0 = unlimited). A server that cannot be reached, or drops a call,
is skipped for a backoff period that doubles on each consecutive failure; once it expires the
next call tries it again, and a success clears the failures. A server that says it is full is
skipped for a short cool-down without counting as a failure. A server that takes the TCP
connection but holds the websocket upgrade is warming up (vllm-omni does so while its engine
starts): it is retried every few seconds without counting as a failure until it has been
warming for `warmup_seconds`, and only then backed off as failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.logs.redact import redact_text, redact_url
from agent.plugins.base import PluginError

DEFAULT_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
FULL_COOLDOWN_SECONDS = 2.0
WARMUP_SECONDS = 120.0
WARMING_RETRY_SECONDS = 5.0
RTT_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, float("inf"))


@dataclass
class Upstream:
    url: str
    capacity: int = 0  # 0 = no limit known to the agent
    active: int = 0
    assigned: int = 0  # calls ever given to it (tie-break: spread evenly)
    failures: int = 0  # consecutive
    failures_total: int = 0
    skip_until: float = 0.0
    warming_since: float | None = None  # first held upgrade of the current warm-up
    last_error: str | None = None
    # Round trips (input frame sent → its answering output frame), for /metrics: cumulative
    # counts per upper bound in RTT_BUCKETS, and their sum.
    rtt_counts: list[int] = field(default_factory=lambda: [0] * len(RTT_BUCKETS))
    rtt_sum: float = 0.0

    def observe_rtt(self, seconds: float) -> None:
        for index, bound in enumerate(RTT_BUCKETS):
            if seconds <= bound:
                self.rtt_counts[index] += 1
        self.rtt_sum += seconds

    @property
    def label(self) -> str:
        """The URL as it may be printed or served (credentials masked)."""
        return redact_url(self.url)

    def has_room(self) -> bool:
        return self.capacity == 0 or self.active < self.capacity

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "url": self.label,
            "capacity": self.capacity,
            "active": self.active,
            "assigned": self.assigned,
            "healthy": now >= self.skip_until,
            "warming_for_s": (None if self.warming_since is None
                              else round(now - self.warming_since, 3)),
            "failures": self.failures,
            "failures_total": self.failures_total,
            "rtt_seconds": {
                "buckets": dict(zip(map(str, RTT_BUCKETS), self.rtt_counts, strict=True)),
                "sum": round(self.rtt_sum, 6),
            },
            "retry_in_s": round(max(0.0, self.skip_until - now), 3),
            "last_error": redact_text(self.last_error) if self.last_error else None,
        }


class Lease:
    """One call's claim on an upstream's capacity; `release` is idempotent."""

    def __init__(self, pool: UpstreamPool, upstream: Upstream) -> None:
        self.pool = pool
        self.upstream = upstream
        self.released = False

    @property
    def url(self) -> str:
        return self.upstream.url

    @property
    def label(self) -> str:
        return self.upstream.label

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.upstream.active -= 1


class UpstreamPool:
    """Not thread-safe: use it from the event loop only."""

    def __init__(
        self,
        urls: Sequence[str],
        capacity: int = 0,
        *,
        clock: Callable[[], float] = time.monotonic,
        backoff_seconds: float = DEFAULT_BACKOFF_SECONDS,
        max_backoff_seconds: float = MAX_BACKOFF_SECONDS,
        full_cooldown_seconds: float = FULL_COOLDOWN_SECONDS,
        warmup_seconds: float = WARMUP_SECONDS,
        warming_retry_seconds: float = WARMING_RETRY_SECONDS,
    ) -> None:
        if not urls:
            raise PluginError("no_upstream", "at least one --upstream URL is required")
        if capacity < 0:
            raise PluginError("invalid_option", "upstream capacity must be 0 or more")
        self.upstreams = [Upstream(url, capacity) for url in urls]
        self.clock = clock
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.full_cooldown_seconds = full_cooldown_seconds
        self.warmup_seconds = warmup_seconds
        self.warming_retry_seconds = warming_retry_seconds

    @property
    def total_capacity(self) -> int:
        """Calls the whole pool can hold, 0 when any upstream is unlimited."""
        if any(u.capacity == 0 for u in self.upstreams):
            return 0
        return sum(u.capacity for u in self.upstreams)

    def candidates(self) -> list[Upstream]:
        """Healthy upstreams with room, least loaded first."""
        now = self.clock()
        ready = [u for u in self.upstreams if now >= u.skip_until and u.has_room()]
        return sorted(ready, key=lambda u: (u.active, u.assigned))

    def acquire(self) -> Lease:
        """Reserve a seat on the best upstream, or raise a 503 PluginError saying why not."""
        choices = self.candidates()
        if not choices:
            raise self._unavailable()
        upstream = choices[0]
        upstream.active += 1
        upstream.assigned += 1
        return Lease(self, upstream)

    def _unavailable(self) -> PluginError:
        now = self.clock()
        full = [
            u for u in self.upstreams
            if (now >= u.skip_until and not u.has_room())
            or (u.failures == 0 and u.skip_until > now)
        ]
        if any(u.warming_since is not None for u in self.upstreams):
            return PluginError(
                "upstreams_warming_up",
                "a model server is still warming up; retry in a few seconds", status=503,
            )
        if full:
            return PluginError(
                "upstreams_full",
                f"all {len(self.upstreams)} model servers are at capacity; retry later",
                status=503,
            )
        return PluginError(
            "upstreams_unavailable",
            f"none of the {len(self.upstreams)} model servers is reachable; retry later",
            status=503,
        )

    def mark_ok(self, upstream: Upstream) -> None:
        upstream.failures = 0
        upstream.skip_until = 0.0
        upstream.warming_since = None
        upstream.last_error = None

    def mark_failed(self, upstream: Upstream, reason: str) -> None:
        upstream.failures += 1
        upstream.failures_total += 1
        delay = min(
            self.max_backoff_seconds, self.backoff_seconds * 2 ** (upstream.failures - 1)
        )
        upstream.skip_until = self.clock() + delay
        upstream.last_error = reason

    def mark_warming(self, upstream: Upstream) -> None:
        """The server holds the upgrade: wait for it, up to `warmup_seconds` in all."""
        now = self.clock()
        if upstream.warming_since is None:
            upstream.warming_since = now
        if now - upstream.warming_since >= self.warmup_seconds:
            upstream.warming_since = None
            self.mark_failed(upstream, "upstream_warmup_timeout")
            return
        upstream.skip_until = max(upstream.skip_until, now + self.warming_retry_seconds)
        upstream.last_error = "upstream_warming_up"

    def mark_full(self, upstream: Upstream) -> None:
        upstream.skip_until = max(upstream.skip_until, self.clock() + self.full_cooldown_seconds)
        upstream.last_error = "full"

    def describe(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [u.describe(now) for u in self.upstreams]
