"""Oversized RTP datagrams (up to 64 KB) on a real leg: dropped before parsing and counted,
never held; normal packets in between still play; nothing outlives the leg."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from typing import Any

import aiohttp
import numpy as np
from aiortc.rtp import RtpPacket

from agent.telephony.codec import PCMU
from agent.telephony.rtp_leg import MAX_DATAGRAM, RtpLeg
from agent.testing.testsignal import make_test_signal, measure_echo
from tests.support.agents import RunningAgent, wait_until

from .test_rtp_leg import RTP_PATH, Endpoint, Stream, destination_of, endpoint, open_leg

BIG = 64_000  # payload bytes: a 64,012-byte datagram, near the UDP maximum


def oversized(sequence: int, ssrc: int, timestamp: int) -> bytes:
    return RtpPacket(payload_type=0, sequence_number=sequence & 0xFFFF, timestamp=timestamp,
                     ssrc=ssrc, payload=bytes([0x7F]) * BIG).serialize()


async def send_with_oversized(caller: Endpoint, destination: tuple[str, int],
                              stream: Stream) -> int:
    """The stream paced at 20 ms, each packet followed by a 64 KB one a few numbers ahead
    (where a jitter buffer would hold it). Returns how many oversized ones were sent."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    for index, packet in enumerate(stream.packets):
        caller.transport.sendto(packet, destination)  # type: ignore[union-attr]
        caller.transport.sendto(oversized(  # type: ignore[union-attr]
            stream.first_sequence + index + 2, stream.ssrc, (index + 2) * 160), destination)
        await asyncio.sleep(max(0.0, started + (index + 1) * 0.02 - loop.time()))
    return len(stream.packets)


async def test_oversized_datagrams_are_dropped_and_counted_and_audio_still_plays(
    echo_agent: RunningAgent,
) -> None:
    caller = await endpoint()
    signal = make_test_signal(3.0, 8000)
    stream = Stream.of(signal, PCMU, 0)
    count = len(stream.packets)
    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, echo_agent, {"remote": caller.address, "codec": "PCMU"})
        assert status == 201, body
        leg = echo_agent.agent.telephony_legs[body["call_id"]]
        assert isinstance(leg, RtpLeg)
        sent = await send_with_oversized(caller, destination_of(body), stream)
        await wait_until(lambda: leg.packets_oversize == sent)
        await asyncio.sleep(0.4)
        async with http.get(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}") as response:
            stats = await response.json()
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 200
    assert stats["packets_oversize"] == sent and stats["packets_malformed"] == 0
    assert stats["jitter"]["received"] == count  # only the real packets reached the buffer
    assert stats["packet_ms_seen"] == [20.0]  # a 64 KB packet never set the packet duration
    received = [packet for _, packet, _ in caller.packets]
    assert {len(p.payload) for p in received} == {160}
    echo_pcm = PCMU.decode(b"".join(p.payload for p in received)).astype(np.float32) / 32768
    assert measure_echo(signal, echo_pcm, 8000).correlation >= 0.7
    await wait_until(lambda: not echo_agent.agent.telephony_legs)
    caller.transport.close()  # type: ignore[union-attr]


async def flood_peak_bytes(leg: RtpLeg, caller: Endpoint, destination: tuple[str, int]) -> int:
    """400 datagrams of 64 KB with distinct sequence numbers (a buffer would keep each one):
    the most memory the process held meanwhile, above where it started."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        baseline = tracemalloc.get_traced_memory()[0]
        for sequence in range(400):
            caller.transport.sendto(oversized(sequence, 7, sequence * 160),  # type: ignore[union-attr]
                                    destination)
            await asyncio.sleep(0.002)
        await wait_until(lambda: leg.packets_oversize >= 390)  # loopback may lose a few
        return tracemalloc.get_traced_memory()[1] - baseline
    finally:
        if not was_tracing:
            tracemalloc.stop()


async def flood_then_hang_up(http: aiohttp.ClientSession, running: RunningAgent,
                             caller: Endpoint) -> tuple[weakref.ref[RtpLeg], Any]:
    """A latching leg flooded, then fed one real packet, then ended: (a weak reference to
    the leg, its socket's protocol)."""
    status, body = await open_leg(http, running, {"codec": "PCMU"})
    assert status == 201, body
    destination = destination_of(body)
    leg = running.agent.telephony_legs[body["call_id"]]
    assert isinstance(leg, RtpLeg)
    protocol = leg.socket.get_protocol()
    peak = await flood_peak_bytes(leg, caller, destination)
    assert leg.jitter.held == 0 and leg.jitter.stats.received == 0
    # The old leg parsed, decoded and held them: about 14 MiB for one leg.
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB held during the flood"
    # A real packet after the flood is still taken (and latched onto).
    caller.transport.sendto(RtpPacket(payload_type=0, sequence_number=1, timestamp=0,  # type: ignore[union-attr]
                                      ssrc=8, payload=bytes(160)).serialize(), destination)
    await wait_until(lambda: leg.jitter.stats.received == 1)
    async with http.delete(f"{running.url}{RTP_PATH}/{body['call_id']}") as response:
        assert response.status == 200
    await wait_until(lambda: not running.agent.telephony_legs)
    assert leg.jitter.held == 0 and leg.jitter.held_bytes == 0
    return weakref.ref(leg), protocol


async def test_a_flood_of_64_kb_datagrams_holds_no_memory_and_nothing_outlives_the_leg(
    echo_agent: RunningAgent,
) -> None:
    caller = await endpoint()
    async with aiohttp.ClientSession() as http:
        gone, protocol = await flood_then_hang_up(http, echo_agent, caller)
    assert protocol.leg is None  # late datagrams reach nothing
    gc.collect()
    assert gone() is None  # nothing keeps the ended leg (and what it held) alive
    caller.transport.close()  # type: ignore[union-attr]


def test_max_datagram_fits_the_largest_real_packet() -> None:
    assert MAX_DATAGRAM >= 12 + 1920  # RTP header + 60 ms of L16/16000
