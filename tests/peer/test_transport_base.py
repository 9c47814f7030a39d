"""agent/testing/peer/transports/base.py: the playback queue, events on the t0 timeline,
`wait_event`, and the registry's refusal of an unknown transport."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from agent.testing.peer.transports.base import (
    EncodedPlayback,
    PeerCall,
    PeerError,
    PlaybackQueue,
    open_call,
)


class Idle(PeerCall):
    transport = "idle"

    async def connect(self) -> None:
        self.start_clock()

    async def hangup(self) -> None:
        self.mark_ended("hangup")

    async def close(self) -> None:
        return None


def test_playback_queue_plays_in_order_then_silence() -> None:
    queue = PlaybackQueue()
    queue.put(np.ones(3, np.float32))
    queue.put(np.full(4, 2.0, np.float32))
    assert queue.take(5).tolist() == [1, 1, 1, 2, 2]
    assert queue.queued == 2
    assert queue.take(4).tolist() == [2, 2, 0, 0]
    queue.put(np.ones(10, np.float32))
    queue.clear()
    assert queue.queued == 0 and not queue.take(2).any()


async def test_next_chunk_records_what_is_sent_and_playing_follows_the_queue() -> None:
    call = Idle("x://")
    await call.connect()
    call.play(np.full(1500, 0.5, np.float32))
    assert call.playing()
    first = call.next_chunk()
    second = call.next_chunk()
    assert len(first) == 960 and first.all() and second[:540].all() and not second[540:].any()
    assert not call.playing()
    assert call.sent.sample_count == 1920 and len(call.sent.times()) == 2
    call.play(np.ones(960, np.float32))
    call.clear_playback()
    assert not call.next_chunk().any()


async def test_wait_event_matches_new_events_and_with_since_earlier_ones() -> None:
    call = Idle("x://")
    await call.connect()
    call.add_event({"type": "a"})
    assert await call.wait_event(lambda e: e["type"] == "a", 0.05) is None  # already past
    assert (await call.wait_event(lambda e: e["type"] == "a", 0.05, since=0.0)) is not None
    waiter = asyncio.ensure_future(call.wait_event(lambda e: e["missing"] == 1, 2.0))
    await asyncio.sleep(0)
    call.add_event({"type": "b"})  # the predicate raises KeyError: no match, no crash
    call.add_event({"type": "c", "missing": 1})
    timed = await waiter
    assert timed is not None and timed.event["type"] == "c" and timed.t >= 0


async def test_unsupported_operations_are_coded_errors() -> None:
    call = Idle("x://")
    with pytest.raises(PeerError) as dtmf:
        await call.send_dtmf("1")
    with pytest.raises(PeerError) as event:
        await call.send_event({"type": "session.update"})
    assert dtmf.value.code == event.value.code == "unsupported"


def test_open_call_refuses_an_unknown_transport() -> None:
    with pytest.raises(PeerError) as refused:
        open_call("http://127.0.0.1:1", "carrier-pigeon")
    assert refused.value.code == "unsupported" and "webrtc" in refused.value.message


def test_a_read_only_signal_is_encoded_once_for_every_call() -> None:
    encoded: list[int] = []

    def encode(samples: np.ndarray) -> list[bytes]:
        encoded.append(len(samples))
        return [bytes([len(encoded)])] * (len(samples) // 4)

    signal = np.ones(8, np.float32)
    signal.flags.writeable = False
    first, second = EncodedPlayback(encode, 4, b"\0", "x"), EncodedPlayback(encode, 4, b"\0", "x")
    first.put(signal)
    second.put(signal)
    assert encoded == [8]  # shared
    assert second.take()[1] == b"\x01"
    other_codec = EncodedPlayback(encode, 4, b"\0", "y")
    other_codec.put(signal)
    writable = EncodedPlayback(encode, 4, b"\0", "x")
    writable.put(np.ones(8, np.float32))  # may change after queuing: encoded each time
    assert encoded == [8, 8, 8]
    assert first.queued == 8 and first.take()[1] == b"\x01" and first.take()[1] == b"\x01"
    assert first.take()[1] == b"\0" and first.queued == 0  # silence when empty
