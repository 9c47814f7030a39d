"""Every live leg, whatever its transport: what capacity, health, metrics and ownership read."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.leg import Leg

TRANSPORTS = ("webrtc", "media-stream", "rtp")


class LegRegistry:
    def __init__(self, on_added: Callable[[Leg], None] | None = None,
                 on_removed: Callable[[Leg], None] | None = None) -> None:
        self._legs: dict[str, Leg] = {}
        self._pending = 0  # slots held by legs still being set up
        self._on_added = on_added
        self._on_removed = on_removed
        # Told after `on_removed` of every leg that ended (signaling's call.ended webhook).
        self.ended_listeners: list[Callable[[Leg], None]] = []

    def add(self, leg: Leg) -> None:
        self._legs[leg.id] = leg
        if self._on_added is not None:
            self._on_added(leg)

    def discard(self, leg: Leg) -> None:
        """Forget a leg that ended (only this very leg; idempotent)."""
        if self._legs.get(leg.id) is leg:
            del self._legs[leg.id]
            if self._on_removed is not None:
                self._on_removed(leg)
            for listener in self.ended_listeners:
                listener(leg)

    def get(self, leg_id: str, transport: str | None = None) -> Leg | None:
        leg = self._legs.get(leg_id)
        if leg is None or (transport is not None and leg.transport != transport):
            return None
        return leg

    def __contains__(self, leg_id: object) -> bool:
        return leg_id in self._legs

    def __len__(self) -> int:
        return len(self._legs)

    def __iter__(self) -> Iterator[Leg]:
        return iter(list(self._legs.values()))

    def of_transport(self, transport: str) -> dict[str, Leg]:
        return {leg.id: leg for leg in self._legs.values() if leg.transport == transport}

    def count_by_transport(self) -> dict[str, int]:
        counts = Counter({transport: 0 for transport in TRANSPORTS})
        counts.update(leg.transport for leg in self._legs.values())
        return dict(counts)

    @property
    def held_slots(self) -> int:
        """Live legs plus those being set up: what admission compares with capacity."""
        return len(self._legs) + self._pending

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Hold a slot while a leg is set up."""
        self._pending += 1
        try:
            yield
        finally:
            self._pending -= 1
