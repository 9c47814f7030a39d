"""`--rtc-ports` and `--rtc-advertise`: the server as a real process, real aiortc callers on
loopback, and the server's actual UDP sockets read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import aiohttp
import aioice.ice
import pytest
from aiortc import RTCSessionDescription

from agent.rtc_tuning.advertise import advertise_in_sdp, parse_advertised
from agent.rtc_tuning.port_range import (
    PortRange,
    missing_port_internals,
    parse_port_range,
    ports_needed,
)
from tests.support.realtime import RealtimeClient
from tests.support.server_process import running_server

# Below Linux's ephemeral range (32768-60999), so the callers' own sockets never land in it.
RANGE_SEARCH_START = 21000


def free_udp_block(size: int) -> PortRange:
    """`size` consecutive ports nothing holds on 127.0.0.1 now."""
    for low in range(RANGE_SEARCH_START, 30000, 100):
        with contextlib.ExitStack() as stack:
            try:
                for port in range(low, low + size):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                    sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return PortRange(low, low + size - 1)
    raise AssertionError("no free UDP port block")


@contextlib.contextmanager
def holding(ports: list[int]) -> Iterator[None]:
    """Something else holds these UDP ports on 127.0.0.1."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sock.bind(("127.0.0.1", port))
        yield


def udp_sockets_of(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every UDP socket process `pid` holds (IPv4, /proc/net/udp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    with open(f"/proc/{pid}/net/udp") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[9] in inodes:
                address_hex, port_hex = fields[1].split(":")
                address = socket.inet_ntoa(bytes.fromhex(address_hex)[::-1])
                found.append((address, int(port_hex, 16)))
    return found


def host_candidates(sdp: str) -> list[tuple[str, int]]:
    found = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            if fields[7] == "host":
                found.append((fields[4], int(fields[5])))
    return found


async def offer_and_answer(client: RealtimeClient) -> tuple[int, str, dict[str, str]]:
    """Post the caller's offer: (status, body, headers); an answer is applied."""
    sdp = await client.offer_sdp()
    async with aiohttp.ClientSession() as http:
        response = await client.post(http, sdp)
        async with response:
            body = await response.text()
            headers = dict(response.headers)
    if response.status == 201:
        await client.pc.setRemoteDescription(RTCSessionDescription(body, "answer"))
    return response.status, body, headers


def run_cli(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signaling", "--ice-host", "127.0.0.1", "--workers", "1",
         "--port", "1", *flags],
        capture_output=True, text=True, timeout=60)


# -- parsing and the SDP rewrite ----------------------------------------------------------------


def test_port_ranges_parse_and_size() -> None:
    assert parse_port_range("40000-40019") == PortRange(40000, 40019)
    assert parse_port_range("40000-40019").size == 20
    for bad in ("40019-40000", "40000", "0-10", "1-65536", "a-b", "40000-", "-5"):
        with pytest.raises(ValueError):
            parse_port_range(bad)
    assert ports_needed(10, 2) == 20 and ports_needed(10, 0) == 10
    order = PortRange(5000, 5009).search_order()
    assert sorted(order) == list(range(5000, 5010))
    assert all(b == a + 1 or (a, b) == (5009, 5000) for a, b in itertools.pairwise(order))


def test_advertised_addresses_replace_host_candidates_and_c_lines() -> None:
    sdp = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\nm=audio 40001 UDP/TLS/RTP/SAVPF 96\r\n"
           "c=IN IP4 10.0.0.5\r\na=rtcp:9 IN IP4 0.0.0.0\r\n"
           "a=candidate:1 1 udp 2130706431 10.0.0.5 40001 typ host\r\n"
           "a=candidate:2 1 udp 2130706431 fd00::5 40002 typ host\r\n"
           "a=candidate:3 1 udp 1694498815 198.51.100.7 40001 typ srflx raddr 10.0.0.5 "
           "rport 40001\r\n")
    out = advertise_in_sdp(sdp, parse_advertised(["203.0.113.9"]))
    assert "a=candidate:1 1 udp 2130706431 203.0.113.9 40001 typ host\r\n" in out
    assert "c=IN IP4 203.0.113.9\r\n" in out
    assert "fd00::5 40002 typ host" in out  # no IPv6 address advertised: left alone
    assert "198.51.100.7 40001 typ srflx" in out  # only host candidates change
    assert "o=- 1 1 IN IP4 0.0.0.0" in out and "a=rtcp:9 IN IP4 0.0.0.0" in out
    both = advertise_in_sdp(sdp, parse_advertised(["203.0.113.9", "2001:db8::9"]))
    assert "2001:db8::9 40002 typ host" in both
    assert advertise_in_sdp(sdp, ()) == sdp
    for bad in (["nope"], ["0.0.0.0"], ["1.2.3.4", "5.6.7.8"]):
        with pytest.raises(ValueError):
            parse_advertised(bad)


def test_the_aioice_internals_the_port_range_relies_on_are_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_port_internals() == []

    async def changed(self: object, component: int, addresses: list[str]) -> list[object]:
        return []

    import agent.rtc_tuning.port_range as port_range
    monkeypatch.setattr(port_range, "_original_get_component_candidates", None)
    monkeypatch.setattr(aioice.ice.Connection, "get_component_candidates", changed)
    assert missing_port_internals() != []  # an aioice that binds elsewhere is noticed


# -- start-up errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("flags, code", [
    (["--rtc-ports", "40019-40000"], "rtc_ports_invalid"),
    (["--rtc-ports", "forty"], "rtc_ports_invalid"),
    (["--rtc-ports", "40000-40001", "--max-sessions", "3"], "rtc_ports_too_few"),
    (["--rtc-advertise", "public"], "rtc_advertise_invalid"),
])
def test_bad_flags_are_one_line_start_up_errors(flags: list[str], code: str) -> None:
    result = run_cli(*flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]: "), result.stderr


# -- real calls ---------------------------------------------------------------------------------


async def test_calls_bind_only_inside_the_range_and_skip_ports_in_use() -> None:
    ports = free_udp_block(20)
    taken = [ports.low + i for i in range(0, 20, 2)]  # every other port held by "someone"
    with holding(taken):
        async with running_server("--workers", "1", "--max-sessions", "10",
                                  "--rtc-ports", str(ports)) as (server, url, _):
            clients = [RealtimeClient(url, seconds=10.0) for _ in range(3)]
            try:
                answered = []
                for client in clients:
                    status, answer, _ = await offer_and_answer(client)
                    assert status == 201, answer
                    answered += set(host_candidates(answer))  # (one per BUNDLEd m-line)
                for client in clients:
                    await asyncio.wait_for(client.connected.wait(), 15)
                await clients[0].wait_audio(0.5)
                assert len(answered) == 3
                assert all(address == "127.0.0.1" and port in ports and port not in taken
                           for address, port in answered), answered
                bound = udp_sockets_of(server.pid)
                assert {port for _, port in answered} <= {port for _, port in bound}
                assert bound and all(port in ports for _, port in bound), bound
                async with aiohttp.ClientSession() as http:
                    for path in ("/health", "/v1/realtime/config"):
                        async with http.get(url + path) as response:
                            shown = (await response.json())["rtc"]
                        assert shown == {"ports": str(ports), "udp_port": None,
                                         "advertise": []}
            finally:
                for client in clients:
                    await client.close()


async def test_an_exhausted_range_refuses_the_next_call_with_a_coded_503() -> None:
    ports = free_udp_block(2)
    async with running_server("--workers", "1", "--max-sessions", "2",
                              "--rtc-ports", str(ports)) as (server, url, _):
        first, second = RealtimeClient(url, seconds=10.0), RealtimeClient(url, seconds=10.0)
        try:
            with holding([ports.low]):  # something else took one of the two ports
                status, answer, _ = await offer_and_answer(first)
                assert status == 201, answer
                await asyncio.wait_for(first.connected.wait(), 15)
                assert set(host_candidates(answer)) == {("127.0.0.1", ports.high)}
                status, body, headers = await offer_and_answer(second)
                assert status == 503, body
                assert '"rtc_ports_exhausted"' in body
                assert headers.get("Retry-After")
                # The first call keeps going: its echo still arrives after the refusal.
                heard = first.received_seconds
                await first.wait_audio(heard + 1.0)
                assert first.pc.connectionState == "connected"
                # Nothing of the refused call is left bound.
                assert [port for _, port in udp_sockets_of(server.pid)] == [ports.high]
        finally:
            await first.close()
            await second.close()


class NatForward(asyncio.DatagramProtocol):
    """A 1:1 NAT in miniature: the public address:port forwards to the private one, and the
    private socket's replies go back to the caller. Counts what it carried each way."""

    def __init__(self, private: tuple[str, int]) -> None:
        self.private = private
        self.caller: tuple[str, int] | None = None
        self.inbound = 0
        self.outbound = 0
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        assert self.transport is not None
        if addr == self.private:
            if self.caller is not None:
                self.outbound += 1
                self.transport.sendto(data, self.caller)
        else:
            self.caller = addr
            self.inbound += 1
            self.transport.sendto(data, self.private)


async def test_advertised_address_in_the_answer_while_sockets_stay_private() -> None:
    ports = free_udp_block(4)
    async with running_server("--workers", "1", "--max-sessions", "4",
                              "--rtc-ports", str(ports),
                              "--rtc-advertise", "127.0.0.2") as (server, url, _):
        client = RealtimeClient(url, seconds=10.0)
        nat: asyncio.DatagramTransport | None = None
        try:
            sdp = await client.offer_sdp()
            async with aiohttp.ClientSession() as http:
                response = await client.post(http, sdp)
                async with response:
                    answer = await response.text()
                    assert response.status == 201, answer
                async with http.get(url + "/v1/realtime/config") as response:
                    assert (await response.json())["rtc"]["advertise"] == ["127.0.0.2"]
            # The rewrite: every host candidate and c= line says 127.0.0.2, none 127.0.0.1.
            candidates = host_candidates(answer)
            assert candidates and all(address == "127.0.0.2" for address, _ in candidates)
            c_lines = [line for line in answer.splitlines() if line.startswith("c=")]
            assert c_lines and all(line == "c=IN IP4 127.0.0.2" for line in c_lines)
            assert "127.0.0.1" not in answer
            # The sockets stay bound to the private address, on the advertised port.
            port = candidates[0][1]
            assert udp_sockets_of(server.pid) == [("127.0.0.1", port)]
            # The public address forwards to the private socket, as the 1:1 NAT would.
            loop = asyncio.get_running_loop()
            nat, forward = await loop.create_datagram_endpoint(
                lambda: NatForward(("127.0.0.1", port)), local_addr=("127.0.0.2", port))
            await client.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            await asyncio.wait_for(client.connected.wait(), 15)
            await client.wait_audio(1.0)
            # The caller checked the advertised address, and the agent answered through it.
            assert forward.inbound > 0 and forward.outbound > 0
        finally:
            await client.close()
            if nat is not None:
                nat.close()
