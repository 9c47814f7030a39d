"""The one registry of live legs: what admission, health, metrics and ownership read."""

from __future__ import annotations

import pytest

from agent.leg_registry import LegRegistry


class FakeLeg:
    """Only what the registry reads of a leg: an id and a transport."""

    def __init__(self, leg_id: str, transport: str) -> None:
        self.id = leg_id
        self.transport = transport


def test_legs_of_every_transport_are_counted_together() -> None:
    started: list[str] = []
    ended: list[str] = []
    registry = LegRegistry(on_added=lambda leg: started.append(leg.id),
                           on_removed=lambda leg: ended.append(leg.id))
    call, stream, rtp = FakeLeg("call_a", "webrtc"), FakeLeg("ms_b", "media-stream"), \
        FakeLeg("rtp_c", "rtp")
    for leg in (call, stream, rtp):
        registry.add(leg)  # type: ignore[arg-type]
    assert len(registry) == 3 and registry.held_slots == 3
    assert registry.count_by_transport() == {"webrtc": 1, "media-stream": 1, "rtp": 1}
    assert registry.of_transport("rtp") == {"rtp_c": rtp}
    assert registry.get("rtp_c", "rtp") is rtp and registry.get("rtp_c", "webrtc") is None
    assert "call_a" in registry and "call_x" not in registry
    registry.discard(stream)  # type: ignore[arg-type]
    registry.discard(stream)  # type: ignore[arg-type]  # idempotent: one end, counted once
    assert started == ["call_a", "ms_b", "rtp_c"] and ended == ["ms_b"]
    assert registry.count_by_transport() == {"webrtc": 1, "media-stream": 0, "rtp": 1}


def test_discard_forgets_only_that_very_leg() -> None:
    registry = LegRegistry()
    first, impostor = FakeLeg("call_a", "webrtc"), FakeLeg("call_a", "webrtc")
    registry.add(first)  # type: ignore[arg-type]
    registry.discard(impostor)  # type: ignore[arg-type]
    assert registry.get("call_a") is first


def test_a_reserved_slot_counts_until_setup_ends() -> None:
    registry = LegRegistry()
    with registry.reserve():
        assert registry.held_slots == 1 and len(registry) == 0
        with pytest.raises(RuntimeError), registry.reserve():
            assert registry.held_slots == 2
            raise RuntimeError("setup failed")
        assert registry.held_slots == 1
    assert registry.held_slots == 0
