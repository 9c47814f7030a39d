"""Token buckets by key in a bounded table: the one rate limiter behind the SIP user agent's
abuse limits — new INVITEs per source address (guard.py), every message per source address
(budget.py) and outbound calls per API key (outbound_policy.py).

A key's bucket holds up to `burst` tokens and gets `rate` back a second; `take` spends one.
The table keeps at most `size` keys, least recently used first out: a key pushed out starts
again with a full bucket, which only ever errs on the side of serving, and a flood of distinct
keys cannot grow it. The arithmetic is a few lines on an ordered dict; the rate-limit
libraries on PyPI (limits, aiolimiter) keep per-key state without a bound or per-limiter
objects, which is what a flood of distinct addresses must not grow.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from agent.audio.clock import Clock, MonotonicClock


@dataclass
class Bucket:
    tokens: float
    updated: float
    refusals: int = 0  # within the second that began at `window` (for a caller's reply cap)
    window: float = 0.0


class BucketTable:
    """`rate` tokens a second up to `burst` for each key, at most `size` keys (LRU)."""

    def __init__(self, rate: float, burst: float, size: int, clock: Clock | None = None,
                 counters: Counter[str] | None = None) -> None:
        if rate < 0 or burst < 1 or size < 1:
            raise ValueError("the rate must be >= 0, the burst and table size >= 1")
        self.rate, self.burst, self.size = rate, float(burst), size
        self._clock = clock or MonotonicClock()
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()
        # its owner's counters: "addresses_evicted", the keys pushed out to keep within `size`
        self.counters: Counter[str] = Counter() if counters is None else counters

    def __len__(self) -> int:
        return len(self._buckets)

    def now(self) -> float:
        return self._clock.now()

    def take(self, key: str) -> tuple[Bucket, float]:
        """Spend one of `key`'s tokens: its bucket, and 0.0 when one was spent, else the
        seconds until the next token (nothing spent). A rate of 0 means no limit."""
        now = self._clock.now()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = Bucket(self.burst, now, window=now)
            self._buckets[key] = bucket
            if len(self._buckets) > self.size:
                self._buckets.popitem(last=False)
                self.counters["addresses_evicted"] += 1
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        if self.rate <= 0 or bucket.tokens >= 1.0:
            bucket.tokens = max(0.0, bucket.tokens - 1.0)
            return bucket, 0.0
        return bucket, (1.0 - bucket.tokens) / self.rate
