"""Plain RTP legs: a UDP sender/receiver pair on 127.0.0.1 talks to the agent's RTP port."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc.rtp import RtpPacket

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings
from agent.telephony.codec import L16_16K, PCMU, NarrowbandCodec
from agent.telephony.rtp_leg import RtpSettings
from agent.telephony.telephone_event import telephone_event_payload
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.telephony import TelephonyConfig
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.keypad_plugin import KeypadEchoPlugin

RTP_PATH = "/v1/telephony/rtp"


class Endpoint(asyncio.DatagramProtocol):
    """One UDP socket: what a PBX's RTP port would be."""

    def __init__(self) -> None:
        self.packets: list[tuple[float, RtpPacket, tuple[str, int]]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.packets.append((time.monotonic(), RtpPacket.parse(data), addr))

    @property
    def address(self) -> str:
        host, port = self.transport.get_extra_info("sockname")[:2]  # type: ignore[union-attr]
        return f"{host}:{port}"


async def endpoint() -> Endpoint:
    _, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        Endpoint, local_addr=("127.0.0.1", 0))
    return protocol


@dataclass
class Stream:
    codec: NarrowbandCodec
    payload_type: int
    ssrc: int = 0x1234ABCD
    first_sequence: int = 65490  # wraps during the call
    packets: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, signal: np.ndarray, codec: NarrowbandCodec, payload_type: int) -> Stream:
        stream = cls(codec, payload_type)
        step = codec.samples_per_chunk
        pcm = (signal * 32767).astype(np.int16)
        for index in range(len(pcm) // step):
            stream.packets.append(RtpPacket(
                payload_type=payload_type, sequence_number=(stream.first_sequence + index) & 0xFFFF,
                timestamp=index * step, ssrc=stream.ssrc,
                payload=codec.encode(pcm[index * step:(index + 1) * step]),
            ).serialize())
        return stream


async def send_paced(sender: Endpoint, destination: tuple[str, int], packets: list[bytes],
                     order: list[int], dropped: set[int],
                     foreign: Endpoint | None = None) -> None:
    started = time.monotonic()
    rng = np.random.default_rng(11)
    for slot, index in enumerate(order):
        if index not in dropped:
            sender.transport.sendto(packets[index], destination)  # type: ignore[union-attr]
        if foreign is not None and slot % 5 == 0:
            noise = (rng.standard_normal(160) * 8000).astype(np.int16)
            foreign.transport.sendto(RtpPacket(  # type: ignore[union-attr]
                payload_type=0, sequence_number=slot, timestamp=slot * 160, ssrc=99,
                payload=PCMU.encode(noise)).serialize(), destination)
        await asyncio.sleep(max(0.0, started + (slot + 1) * 0.02 - time.monotonic()))


def shuffled_order(count: int, seed: int) -> list[int]:
    """Neighbours swapped now and then, and an occasional packet two slots late."""
    order = list(range(count))
    rng = random.Random(seed)
    for index in range(0, count - 3, 7):
        if rng.random() < 0.5:
            order[index], order[index + 1] = order[index + 1], order[index]
        else:
            order[index], order[index + 2] = order[index + 2], order[index]
    return order


def destination_of(body: dict[str, Any]) -> tuple[str, int]:
    host, port = body["local"].rsplit(":", 1)
    return host, int(port)


async def open_leg(http: aiohttp.ClientSession, running: RunningAgent,
                   body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with http.post(running.url + RTP_PATH, json=body) as response:
        return response.status, await response.json()


@pytest.mark.slow
async def test_signal_comes_back_through_reordering_loss_and_a_foreign_sender(
    echo_agent: RunningAgent,
) -> None:
    caller, intruder = await endpoint(), await endpoint()
    signal = make_test_signal(5.0, 8000)
    stream = Stream.of(signal, PCMU, 0)
    count = len(stream.packets)
    dropped = set(random.Random(5).sample(range(count), count // 20))  # 5%
    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, echo_agent, {"remote": caller.address, "codec": "PCMU"})
        assert status == 201, body
        assert body["codec"] == "PCMU" and body["local"].startswith("127.0.0.1:")
        await send_paced(caller, destination_of(body), stream.packets,
                         shuffled_order(count, 2), dropped, foreign=intruder)
        await asyncio.sleep(0.4)
        async with http.get(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}") as response:
            stats = await response.json()
        assert echo_agent.agent.health()["active_calls"] == 1
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 200
            assert (await response.json())["ended"] is True
    received = [packet for _, packet, _ in caller.packets]
    assert intruder.packets == []  # the agent answers its remote only
    assert stats["packets_foreign"] >= count // 5 - 1
    assert stats["jitter"]["reordered"] > 0 and stats["jitter"]["lost"] >= len(dropped) - 2
    # The agent's RTP: G.711 μ-law, 20 ms packets, one stream with consecutive numbering.
    assert {p.payload_type for p in received} == {0}
    assert {len(p.payload) for p in received} == {160}
    assert len({p.ssrc for p in received}) == 1
    assert all((b.sequence_number - a.sequence_number) & 0xFFFF == 1
               for a, b in zip(received, received[1:], strict=False))
    assert all((b.timestamp - a.timestamp) & 0xFFFFFFFF == 160
               for a, b in zip(received, received[1:], strict=False))
    assert len(received) >= 0.8 * count
    echo_pcm = PCMU.decode(b"".join(p.payload for p in received)).astype(np.float32) / 32768
    echo = measure_echo(signal, echo_pcm, 8000)
    assert echo.correlation >= 0.7, echo
    await wait_until(lambda: not echo_agent.agent.telephony_legs
                     and not echo_agent.agent.ticker.slots)
    caller.transport.close()  # type: ignore[union-attr]
    intruder.transport.close()  # type: ignore[union-attr]


async def test_latching_leg_speaks_l16_back_to_whoever_sent_first(echo_agent: RunningAgent) -> None:
    caller = await endpoint()
    signal = make_test_signal(2.5, 16000)
    stream = Stream.of(signal, L16_16K, 118)
    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, echo_agent, {"codec": "L16/16000"})
        assert status == 201, body
        assert body["remote"] is None
        await send_paced(caller, destination_of(body), stream.packets,
                         list(range(len(stream.packets))), set())
        await asyncio.sleep(0.4)
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 200
    received = [packet for _, packet, _ in caller.packets]
    assert {p.payload_type for p in received} == {118}  # the dynamic type it was sent
    assert {len(p.payload) for p in received} == {640}
    echo_pcm = L16_16K.decode(b"".join(p.payload for p in received)).astype(np.float32) / 32768
    assert measure_echo(signal, echo_pcm, 16000).correlation >= 0.7
    caller.transport.close()  # type: ignore[union-attr]


async def test_a_leg_whose_remote_goes_quiet_ends(start_agent: AgentFactory) -> None:
    running = await start_agent(settings=AgentSettings(call=CallSettings(idle_timeout=0.5)))
    caller = await endpoint()
    stream = Stream.of(make_test_signal(0.2, 8000), PCMU, 0)
    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, running, {"remote": caller.address})
        assert status == 201
        await send_paced(caller, destination_of(body), stream.packets,
                         list(range(len(stream.packets))), set())
        await wait_until(lambda: not running.agent.telephony_legs)
        async with http.get(f"{running.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 404
    assert not running.agent.ticker.slots
    caller.transport.close()  # type: ignore[union-attr]


async def test_bad_requests_get_coded_errors(echo_agent: RunningAgent) -> None:
    cases = [
        ({"remote": "example.com:4000"}, "invalid_address"),
        ({"remote": "127.0.0.1"}, "invalid_address"),
        ({"remote": "127.0.0.1:70000"}, "invalid_address"),
        ({"remote": 5}, "invalid_address"),
        ({"codec": "G729"}, "unsupported_codec"),
        ({"codec": 8}, "unsupported_codec"),
        ({"session": "x"}, "invalid_session"),
        ({"session": {"extra_body": {"delay_frames": -1}}}, "invalid_option"),
        ({"dtmf_payload_type": 0}, "invalid_payload_type"),
        ({"dtmf_payload_type": "101"}, "invalid_payload_type"),
        ({"dtmf_payload_type": True}, "invalid_payload_type"),
        ({"dtmf_payload_type": 128}, "invalid_payload_type"),
    ]
    async with aiohttp.ClientSession() as http:
        for body, code in cases:
            status, answer = await open_leg(http, echo_agent, body)
            assert (status, answer["error"]["code"]) == (400, code), body
        async with http.post(echo_agent.url + RTP_PATH, data="nope",
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/rtp_unknown") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
    assert not echo_agent.agent.telephony_legs and not echo_agent.agent.ticker.slots


def _free_even_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port % 2 == 0 and port >= 1024:
            return port


async def test_port_range_and_call_limit(start_agent: AgentFactory) -> None:
    port = _free_even_port()
    running = await start_agent(
        settings=AgentSettings(max_calls=2),
        telephony_config=TelephonyConfig(rtp=RtpSettings(port_min=port, port_max=port + 1)),
    )
    async with aiohttp.ClientSession() as http:
        status, first = await open_leg(http, running, {"remote": "127.0.0.1:9"})
        assert status == 201 and first["local"] == f"127.0.0.1:{port}"
        status, second = await open_leg(http, running, {"remote": "127.0.0.1:9"})
        assert (status, second["error"]["code"]) == (503, "no_rtp_port")
        assert running.agent.health()["active_calls"] == 1
        # The call limit counts RTP legs like WebRTC calls.
        running.agent.settings.max_calls = 1
        status, third = await open_leg(http, running, {"remote": "127.0.0.1:9"})
        assert (status, third["error"]["code"]) == (503, "server_full")
        async with http.delete(f"{running.url}{RTP_PATH}/{first['call_id']}") as response:
            assert response.status == 200
        status, again = await open_leg(http, running, {"remote": "127.0.0.1:9"})
        assert status == 201 and again["local"] == f"127.0.0.1:{port}"  # the port was freed
    await running.server.close()  # shutdown ends the leg
    assert not running.agent.telephony_legs and not running.agent.ticker.slots


def key_press(digit: str, timestamp: int, first_sequence: int, ssrc: int) -> list[bytes]:
    """What a PBX sends for one key press on payload type 101: three updates while the key is
    held, then the end packet three times, all with the press's start timestamp."""
    payloads = [telephone_event_payload(digit, end=False, duration=160 * (n + 1)) for n in range(3)]
    payloads += [telephone_event_payload(digit, end=True, duration=640)] * 3
    return [RtpPacket(payload_type=101, marker=int(n == 0), sequence_number=first_sequence + n,
                      timestamp=timestamp, ssrc=ssrc, payload=payload).serialize()
            for n, payload in enumerate(payloads)]


async def test_rfc4733_key_presses_become_dtmf_events(start_agent: AgentFactory) -> None:
    plugin = KeypadEchoPlugin()
    running = await start_agent(plugin)
    caller = await endpoint()
    stream = Stream.of(make_test_signal(2.0, 8000), PCMU, 0)
    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, running, {"remote": caller.address})
        assert status == 201, body
        assert body["dtmf_payload_type"] == 101
        destination = destination_of(body)
        # Audio, then "1", "#", "1" (a digit twice in a row is two presses), and a flash
        # (event 16), which is not a digit; with audio packets around them.
        packets = list(stream.packets[:20])
        for n, digit in enumerate("1#1"):
            packets += key_press(digit, 3200 * (n + 1), 1000 + 10 * n, stream.ssrc)
            packets += stream.packets[20 + 5 * n: 25 + 5 * n]
        packets.append(RtpPacket(payload_type=101, sequence_number=1100, timestamp=99_000,
                                 ssrc=stream.ssrc, payload=bytes([16, 0x8A, 0, 160])).serialize())
        await send_paced(caller, destination, packets, list(range(len(packets))), set())
        await wait_until(lambda: len(plugin.digits) == 3)
        (leg,) = running.agent.telephony_legs.values()
        events = [e["event"] for e in leg.events
                  if e["type"] == "input_audio_buffer.dtmf_event_received"]
        stats = leg.stats()
        async with http.delete(f"{running.url}{RTP_PATH}/{body['call_id']}") as response:
            assert response.status == 200
    assert plugin.digits == ["1", "#", "1"]
    assert events == ["1", "#", "1"]
    assert stats["telephone_event_packets"] == 3 * 6 + 1
    assert stats["packets_other_payload"] == 0
    # The audio around the digits was taken as audio, the digits were not.
    assert stats["jitter"]["received"] == 20 + 15


async def test_remote_audio_from_another_port_is_taken_unless_strict(
        echo_agent: RunningAgent) -> None:
    # Endpoints without symmetric RTP send from another port than the one they receive on.
    listener, sender = await endpoint(), await endpoint()
    stream = Stream.of(make_test_signal(1.0, 8000), PCMU, 0)
    count = len(stream.packets)
    stats: dict[bool, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as http:
        for strict in (False, True):
            status, body = await open_leg(http, echo_agent, {
                "remote": listener.address, "codec": "PCMU", "strict_remote_port": strict})
            assert status == 201, body
            await send_paced(sender, destination_of(body), stream.packets, list(range(count)),
                             set())
            url = f"{echo_agent.url}{RTP_PATH}/{body['call_id']}"
            await wait_until(lambda call_id=body["call_id"]: (
                echo_agent.agent.telephony_legs[call_id].stats()["packets_foreign"]
                + echo_agent.agent.telephony_legs[call_id].stats()["jitter"]["received"]
                >= count))
            async with http.get(url) as response:
                stats[strict] = await response.json()
            async with http.delete(url) as response:
                assert response.status == 200
        status, body = await open_leg(http, echo_agent, {
            "remote": listener.address, "strict_remote_port": "yes"})
        assert status == 400 and body["error"]["code"] == "invalid_parameter"
    assert stats[False]["packets_foreign"] == 0 and stats[False]["jitter"]["received"] == count
    assert stats[False]["remote_source"] == sender.address
    assert stats[False]["remote"] == listener.address  # still answered where it was told
    assert stats[False]["packet_ms"] == 20.0
    assert stats[True]["packets_foreign"] == count and stats[True]["jitter"]["received"] == 0
    assert len(listener.packets) > 0 and sender.packets == []
    await wait_until(lambda: not echo_agent.agent.telephony_legs)
    listener.transport.close()  # type: ignore[union-attr]
    sender.transport.close()  # type: ignore[union-attr]


async def test_closed_legs_leave_no_libav_threads_behind(echo_agent: RunningAgent) -> None:
    def os_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    async with aiohttp.ClientSession() as http:
        status, body = await open_leg(http, echo_agent, {"remote": "127.0.0.1:5004"})
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}"):
            pass
        await wait_until(lambda: not echo_agent.agent.telephony_legs)
        before = os_threads()
        gc.disable()  # freed by the leg's own teardown, not by a collection that happens to run
        try:
            for _ in range(20):
                status, body = await open_leg(http, echo_agent, {"remote": "127.0.0.1:5004"})
                assert status == 201, body
                await asyncio.sleep(0.05)  # a few chunks through the resamplers
                async with http.delete(f"{echo_agent.url}{RTP_PATH}/{body['call_id']}"):
                    pass
            await wait_until(lambda: not echo_agent.agent.telephony_legs)
            assert os_threads() <= before + 4  # (20 legs used to leave about 10 more)
        finally:
            gc.enable()
