"""A token bucket: how many control messages a caller may send, so one flooding caller
cannot fill the shared model worker with restarts and keypad digits ahead of everyone's steps."""

from __future__ import annotations

from agent.audio.clock import Clock, MonotonicClock


class TokenBucket:
    """`burst` messages at once, refilled at `rate` per second."""

    def __init__(self, rate: float, burst: int, clock: Clock | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock or MonotonicClock()
        self._tokens = float(burst)
        self._stamp = self._clock.now()
        self.refused = 0

    def take(self) -> bool:
        """Spend one token if there is one; count a refusal otherwise."""
        now = self._clock.now()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.refused += 1
        return False
