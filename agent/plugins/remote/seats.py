"""Seats on an upstream shared by several servers: the lease protocol the remote plugins
ask, where something outside the agent (a cluster, signaling/cluster/leases.py) keeps the
seats of every server together.

A single-conversation engine (Kyutai's and NVIDIA's reference servers hold one call) must
never get a second call from another host, which the host's own pool cannot see. With a
`SeatLeases` given to the plugin (`RemotePlugin.use_seat_leases`), a new session first holds
one of its upstream's seats there; the hold is renewed while the session lives and given
back when it ends. A hold that is lost (taken by another host after it could not be renewed)
ends its session with the coded error `upstream_lease_lost`, rather than speaking over
another call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agent.plugins.base import PluginError


class SeatsUnavailable(PluginError):
    """The shared seats cannot be asked now (their store is unreachable): 503."""

    def __init__(self, message: str) -> None:
        super().__init__("seats_unavailable", message, status=503)


class SeatHold(Protocol):
    """One held seat; renewed by its holder until released."""

    def release(self) -> None:
        """Give the seat back (idempotent; the holder does it in the background)."""


class SeatLeases(Protocol):
    async def hold(self, upstream: str, seats: int, on_lost: Callable[[], None]
                   ) -> SeatHold | None:
        """One of `upstream`'s `seats` seats held for a new session, `on_lost` called (on the
        event loop) if the hold is lost; None when every seat is held elsewhere.
        SeatsUnavailable when the seats cannot be asked."""
