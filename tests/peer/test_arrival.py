"""The kernel's receive time of a read (arrival.py), on a real UDP socket on loopback."""

from __future__ import annotations

import socket
import time

import pytest

from agent.testing.peer.transports.arrival import (
    ANCILLARY_BYTES,
    SO_TIMESTAMPNS,
    arrival,
    stamp_arrivals,
    wall_offset,
)


@pytest.mark.skipif(SO_TIMESTAMPNS is None, reason="no SO_TIMESTAMPNS on this system")
def test_a_stamped_read_gives_when_the_datagram_came_not_when_it_was_read() -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        receiver.bind(("127.0.0.1", 0))
        assert stamp_arrivals(receiver)
        # The kernel turns stamping on a moment after the first socket asks (a deferred
        # switch); until then a datagram is stamped when it is read. Settle that first: warm
        # datagrams until one is stamped before its read.
        settle_by = time.monotonic() + 5
        while True:
            sender.sendto(b"warm", receiver.getsockname())
            time.sleep(0.02)
            before_read = time.monotonic()
            _, warm, _, _ = receiver.recvmsg(64, ANCILLARY_BYTES)
            if arrival(warm, wall_offset()) < before_read - 0.01:
                break
            assert time.monotonic() < settle_by, "the kernel never stamped on arrival"
        sent_at = time.monotonic()
        sender.sendto(b"x", receiver.getsockname())
        time.sleep(0.1)
        read_at = time.monotonic()
        data, ancillary, _, _ = receiver.recvmsg(64, ANCILLARY_BYTES)
        arrived = arrival(ancillary, wall_offset())
        assert data == b"x" and ancillary
        assert sent_at - 0.002 <= arrived < read_at - 0.05, (sent_at, arrived, read_at)
    finally:
        receiver.close()
        sender.close()


def test_without_a_stamp_the_read_time_stands_in() -> None:
    before = time.monotonic()
    assert before <= arrival([], wall_offset()) <= time.monotonic()
