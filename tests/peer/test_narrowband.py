"""agent/testing/peer/transports/narrowband.py: audio kept as G.711 bytes and decoded after the
call gives, piece for piece, what decoding each packet as it came gives (libswresample)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.testing.peer.transports.narrowband import NarrowbandCodec
from agent.testing.testsignal import make_test_signal

RATE = 48000


@pytest.mark.parametrize("name", ["PCMU", "PCMA"])
def test_decoding_after_the_call_matches_decoding_as_packets_came(name: str) -> None:
    sender = NarrowbandCodec(name, RATE)
    payloads = sender.encode_packets(make_test_signal(3.0))
    live = NarrowbandCodec(name, RATE)
    one_by_one = [live.decode(p) for p in payloads]
    one_by_one.append(live.flush())
    later = NarrowbandCodec(name, RATE).decode_many(payloads)
    assert [len(p) for p in later] == [len(p) * 6 for p in payloads]
    a, b = np.concatenate(one_by_one), np.concatenate(later)
    assert len(a) == len(b)
    inner = slice(2000, -2000)
    error = a[inner] - b[inner]
    # The same samples on the same grid, through another interpolation filter.
    assert 10 * np.log10(np.sum(error**2) / np.sum(a[inner] ** 2)) < -45


def test_nothing_to_decode() -> None:
    assert NarrowbandCodec("PCMU", RATE).decode_many([]) == []
