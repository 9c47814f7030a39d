from __future__ import annotations

import pytest

from agent.realtime.rate_limit import TokenBucket
from tests.support.clock import FakeClock


def test_burst_then_refill_at_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=3, clock=clock)
    assert [bucket.take() for _ in range(5)] == [True, True, True, False, False]
    assert bucket.refused == 2
    clock.advance(0.1)  # one token back
    assert [bucket.take() for _ in range(2)] == [True, False]
    clock.advance(60.0)  # never more than the burst, however long the pause
    assert sum(bucket.take() for _ in range(10)) == 3
    assert bucket.refused == 10


def test_sustained_flood_gets_the_rate_not_more() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=10.0, burst=20, clock=clock)
    admitted = 0
    for _ in range(10_000):  # 1000 messages a second for 10 s
        admitted += bucket.take()
        clock.advance(0.001)
    assert 20 + 99 <= admitted <= 20 + 101


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 5), (-1.0, 5), (1.0, 0)])
def test_rejects_nonsense_settings(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst)
