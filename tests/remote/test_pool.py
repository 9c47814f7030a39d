"""The upstream pool's choices, with a fake clock (no sleeping)."""

from __future__ import annotations

import pytest

from agent.plugins.base import PluginError
from agent.plugins.remote.pool import UpstreamPool


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_pool(n: int = 3, capacity: int = 0) -> tuple[UpstreamPool, ManualClock]:
    clock = ManualClock()
    pool = UpstreamPool([f"ws://gpu{i}" for i in range(n)], capacity, clock=clock,
                        backoff_seconds=1.0, max_backoff_seconds=8.0, full_cooldown_seconds=2.0)
    return pool, clock


def test_new_calls_go_to_the_least_loaded_upstream() -> None:
    pool, _ = make_pool(3)
    leases = [pool.acquire() for _ in range(6)]
    assert sorted(u.active for u in pool.upstreams) == [2, 2, 2]
    leases[0].release()
    leases[0].release()  # idempotent
    freed = leases[0].upstream
    assert pool.acquire().upstream is freed


def test_capacity_is_respected_and_a_full_pool_says_so() -> None:
    pool, _ = make_pool(2, capacity=1)
    assert pool.total_capacity == 2
    first, second = pool.acquire(), pool.acquire()
    assert first.upstream is not second.upstream
    with pytest.raises(PluginError) as refused:
        pool.acquire()
    assert refused.value.status == 503 and refused.value.code == "upstreams_full"
    second.release()
    assert pool.acquire().upstream is second.upstream


def test_unlimited_upstream_makes_total_capacity_unlimited() -> None:
    pool, _ = make_pool(2, capacity=0)
    assert pool.total_capacity == 0


def test_failed_upstream_is_skipped_with_growing_backoff_then_retried() -> None:
    pool, clock = make_pool(2)
    bad = pool.upstreams[0]
    pool.mark_failed(bad, "upstream_closed")
    assert all(pool.acquire().upstream is not bad for _ in range(3))
    clock.now += 1.01
    assert bad in pool.candidates()  # backoff over: tried again
    pool.mark_failed(bad, "upstream_closed")  # second failure in a row: 2 s
    clock.now += 1.5
    assert bad not in pool.candidates()
    clock.now += 0.6
    assert bad in pool.candidates()
    for _ in range(10):
        pool.mark_failed(bad, "x")
    assert bad.describe(clock.now)["retry_in_s"] == 8.0  # capped
    pool.mark_ok(bad)
    assert bad.failures == 0 and bad in pool.candidates()


def test_no_reachable_upstream_is_a_503_unavailable() -> None:
    pool, _ = make_pool(2)
    for upstream in pool.upstreams:
        pool.mark_failed(upstream, "upstream_unreachable")
    with pytest.raises(PluginError) as refused:
        pool.acquire()
    assert refused.value.status == 503 and refused.value.code == "upstreams_unavailable"
    described = pool.describe()
    assert [d["healthy"] for d in described] == [False, False]
    assert described[0]["last_error"] == "upstream_unreachable"


def test_an_upstream_that_says_full_cools_down_without_counting_as_failed() -> None:
    pool, clock = make_pool(1)
    pool.mark_full(pool.upstreams[0])
    with pytest.raises(PluginError) as refused:
        pool.acquire()
    assert refused.value.code == "upstreams_full"
    assert pool.upstreams[0].failures == 0
    clock.now += 2.1
    assert pool.acquire().upstream is pool.upstreams[0]


def test_a_pool_needs_an_upstream() -> None:
    with pytest.raises(PluginError) as refused:
        UpstreamPool([])
    assert refused.value.code == "no_upstream"


def test_a_warming_upstream_is_retried_without_failing_until_its_allowance_runs_out() -> None:
    clock = ManualClock()
    pool = UpstreamPool(["ws://gpu0"], clock=clock, backoff_seconds=1.0,
                        warmup_seconds=120.0, warming_retry_seconds=5.0)
    upstream = pool.upstreams[0]
    pool.mark_warming(upstream)
    with pytest.raises(PluginError) as refused:
        pool.acquire()
    assert refused.value.status == 503 and refused.value.code == "upstreams_warming_up"
    assert upstream.failures == 0 and upstream.describe(clock.now)["warming_for_s"] == 0.0
    clock.now += 5.0
    assert pool.candidates() == [upstream]  # tried again after the retry interval
    clock.now += 110.0
    pool.mark_warming(upstream)  # 115 s into its warm-up: still not a failure
    assert upstream.failures == 0 and upstream.describe(clock.now)["warming_for_s"] == 115.0
    clock.now += 5.0
    pool.mark_warming(upstream)  # 120 s: the allowance is spent
    assert upstream.failures == 1 and upstream.last_error == "upstream_warmup_timeout"
    assert upstream.warming_since is None
    with pytest.raises(PluginError) as refused:
        pool.acquire()
    assert refused.value.code == "upstreams_unavailable"


def test_a_warm_up_that_ends_clears_the_warming_state() -> None:
    pool, clock = make_pool(1)
    upstream = pool.upstreams[0]
    pool.mark_warming(upstream)
    clock.now += 60.0
    pool.mark_ok(upstream)
    assert upstream.warming_since is None and upstream in pool.candidates()
    pool.mark_warming(upstream)  # a later restart gets a whole new allowance
    assert upstream.describe(clock.now)["warming_for_s"] == 0.0
