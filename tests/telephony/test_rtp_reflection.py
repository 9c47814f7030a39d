"""RTP legs cannot be aimed at third parties: refused remotes, refused latching sources."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiortc.rtp import RtpPacket

from agent.telephony.address_policy import parse_networks
from agent.telephony.rtp_leg import RtpSettings
from signaling.__main__ import build_parser
from signaling.telephony import TelephonyConfig, config_from_args
from tests.support.agents import AgentFactory, RunningAgent, wait_until

RTP_PATH = "/v1/telephony/rtp"

REFLECTION_TARGETS = [
    ("224.0.0.1:5004", 400, "address_not_permitted"),
    ("[ff02::1]:5004", 400, "address_not_permitted"),
    ("255.255.255.255:5004", 400, "address_not_permitted"),
    ("0.0.0.0:5004", 400, "address_not_permitted"),
    ("[::]:5004", 400, "address_not_permitted"),
    ("169.254.169.254:80", 400, "address_not_permitted"),
    ("[::ffff:169.254.169.254]:80", 400, "address_not_permitted"),
    ("[fe80::1]:5004", 400, "address_not_permitted"),
    ("8.8.8.8:53", 403, "address_not_allowed"),
    ("[2001:db8::1]:5004", 403, "address_not_allowed"),
    ("[::ffff:8.8.8.8]:53", 403, "address_not_allowed"),
]


async def test_reflection_targets_are_refused_before_a_port_is_bound(
    echo_agent: RunningAgent,
) -> None:
    async with aiohttp.ClientSession() as http:
        for remote, status, code in REFLECTION_TARGETS:
            async with http.post(echo_agent.url + RTP_PATH, json={"remote": remote}) as response:
                body = await response.json()
                assert (response.status, body["error"]["code"]) == (status, code), remote
                assert body["error"]["param"] == "remote"
        # A private-range PBX is still fine by default.
        async with http.post(echo_agent.url + RTP_PATH, json={"remote": "10.20.30.40:4000"}) as r:
            assert r.status == 201, await r.text()
            leg = await r.json()
        async with http.delete(f"{echo_agent.url}{RTP_PATH}/{leg['call_id']}") as r:
            assert r.status == 200
    assert not echo_agent.agent.telephony_legs


async def test_a_latching_leg_ignores_sources_outside_the_allow_list(
    start_agent: AgentFactory,
) -> None:
    running = await start_agent(telephony_config=TelephonyConfig(
        rtp=RtpSettings(allowed_networks=parse_networks(["10.0.0.0/8"]))))
    caller = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    caller.bind(("127.0.0.1", 0))
    caller.setblocking(False)
    try:
        async with aiohttp.ClientSession() as http:
            remote = f"127.0.0.1:{caller.getsockname()[1]}"
            async with http.post(running.url + RTP_PATH, json={"remote": remote}) as response:
                assert response.status == 403
                assert (await response.json())["error"]["code"] == "address_not_allowed"
            async with http.post(running.url + RTP_PATH, json={}) as response:
                assert response.status == 201
                leg = await response.json()
            host, port = leg["local"].rsplit(":", 1)
            for sequence in range(10):
                caller.sendto(RtpPacket(payload_type=0, sequence_number=sequence,
                                        timestamp=sequence * 160, ssrc=7,
                                        payload=b"\xff" * 160).serialize(), (host, int(port)))
                await asyncio.sleep(0.02)
            session = running.agent.telephony_legs[leg["call_id"]]
            await wait_until(lambda: session.stats()["packets_refused"] == 10)
            await asyncio.sleep(0.3)  # 15 ticks in which a latched leg would have answered
            url = f"{running.url}{RTP_PATH}/{leg['call_id']}"
            async with http.get(url) as response:
                stats = await response.json()
            assert stats["remote"] is None and stats["packets_sent"] == 0
            assert stats["packets_refused"] == 10
            with pytest.raises(BlockingIOError):
                caller.recv(2048)  # nothing came back
            async with http.delete(url) as response:
                assert response.status == 200
    finally:
        caller.close()


def test_rtp_allow_flag() -> None:
    parser = build_parser()
    default = config_from_args(parser.parse_args([]))
    assert default.rtp.allowed_networks == RtpSettings().allowed_networks
    chosen = config_from_args(parser.parse_args(
        ["--rtp-allow", "203.0.113.0/24", "--rtp-allow", "2001:db8::/32"]))
    assert chosen.rtp.allowed_networks == parse_networks(["203.0.113.0/24", "2001:db8::/32"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--rtp-allow", "not-a-network"])
    assert "--rtp-allow" in parser.format_help()
