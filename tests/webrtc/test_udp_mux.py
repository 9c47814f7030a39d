"""`--rtc-udp-port`: the mux's tables fed real STUN datagrams over loopback, and real calls
(the agent in process, aiortc callers on sockets of their own) sharing one port."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import aioice.ice
import pytest
from aioice import stun
from aioice.utils import random_transaction_id

from agent.media_agent import AgentSettings
from agent.rtc_tuning import udp_mux
from agent.rtc_tuning.udp_mux import (
    MuxedTransport,
    MuxLimits,
    MuxSocket,
    UdpMux,
    missing_mux_internals,
    parse_udp_port,
    use_udp_mux,
)
from agent.testing.testsignal import make_test_signal, measure_echo
from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.rtc_caller import RATE, Caller, host_candidates


class Recorder(asyncio.DatagramProtocol):
    """Stands in for aioice's StunProtocol: records what the mux delivers to it."""

    def __init__(self, connection: object) -> None:
        self.receiver = connection
        self.received: list[tuple[bytes, tuple[str, int]]] = []
        self.lost = False

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.append((data, addr))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


class FakeConnection:
    """The three fields the mux reads of an aioice Connection."""

    def __init__(self, ufrag: str, password: str, remote_password: str = "remote-pwd") -> None:
        self.local_username = ufrag
        self.local_password = password
        self.remote_password = remote_password


def check(username: str, password: str) -> bytes:
    message = stun.Message(message_method=stun.Method.BINDING,
                           message_class=stun.Class.REQUEST,
                           transaction_id=random_transaction_id())
    message.attributes["USERNAME"] = username
    message.attributes["PRIORITY"] = 1
    message.add_message_integrity(password.encode())
    return bytes(message)


class Peer:
    """A remote UDP socket on loopback that sends to the mux."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 0))
        self.sock.settimeout(2)
        self.addr: tuple[str, int] = self.sock.getsockname()

    def send(self, data: bytes, to: tuple[str, int]) -> None:
        self.sock.sendto(data, to)

    def recv(self) -> bytes:
        return self.sock.recv(2048)


@pytest.fixture
async def mux_socket() -> AsyncIterator[MuxSocket]:
    mux = MuxSocket("127.0.0.1", 0, MuxLimits(pending_entries=64, slow_rate=200.0,
                                                slow_burst=100.0))
    mux.attach(asyncio.get_running_loop())
    yield mux
    mux.close()


def attach_call(mux: MuxSocket, ufrag: str, password: str) -> tuple[MuxedTransport, Recorder]:
    protocol = Recorder(FakeConnection(ufrag, password))
    transport = MuxedTransport(mux, protocol, asyncio.get_running_loop())
    mux.register(transport)
    return transport, protocol


async def settle(mux: MuxSocket, expected_total: int) -> None:
    """Until the mux has read `expected_total` datagrams of any kind (loopback is lossless)."""
    def seen() -> int:
        s = mux.stats
        return (s.routed + s.checks + s.responses + s.unrouted + s.bad_integrity
                + s.unknown_username + s.rate_limited + s.malformed)
    await wait_until(lambda: seen() >= expected_total, 5)


# -- the tables, fed real datagrams ---------------------------------------------------------


def test_the_port_flag_parses() -> None:
    assert parse_udp_port("40000") == 40000
    for bad in ("0", "65536", "x", "", "-3"):
        with pytest.raises(ValueError):
            parse_udp_port(bad)


def test_the_aioice_internals_the_mux_relies_on_are_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_mux_internals() == []

    async def changed(self: object, component: int, addresses: list[str]) -> list[object]:
        return []

    monkeypatch.setattr(udp_mux, "_original_get_component_candidates", None)
    monkeypatch.setattr(aioice.ice.Connection, "get_component_candidates", changed)
    assert missing_mux_internals() != []  # an aioice that binds elsewhere is noticed


async def test_a_check_routes_its_address_and_then_media_follows(mux_socket: MuxSocket) -> None:
    transport, call = attach_call(mux_socket, "abcd", "p" * 22)
    peer = Peer()
    peer.send(b"\x80dtls-before-any-check", mux_socket.sockname)  # not yet validated
    peer.send(check("abcd:zzzz", "p" * 22), mux_socket.sockname)
    peer.send(b"\x16\xfe\xfdrtp-or-dtls", mux_socket.sockname)
    await settle(mux_socket, 3)
    assert [data[:1] for data, _ in call.received] == [b"\x00", b"\x16"]
    assert mux_socket.stats.unrouted == 1 and mux_socket.routes == {peer.addr: transport}
    transport.sendto(b"reply", peer.addr)  # the call's own sends leave from the shared port
    assert peer.recv() == b"reply"
    transport.close()  # the call ended: nothing of it is left
    await asyncio.sleep(0)
    assert call.lost and mux_socket.routes == {} and mux_socket.ufrags == {}


async def test_spoofed_packets_from_an_unvalidated_address_are_ignored(
        mux_socket: MuxSocket) -> None:
    _, call = attach_call(mux_socket, "live", "s" * 22)
    genuine, spoofer = Peer(), Peer()
    genuine.send(check("live:peer", "s" * 22), mux_socket.sockname)
    await settle(mux_socket, 1)
    # The spoofer knows the live call's ufrag (it is in the SDP) but not its password.
    spoofer.send(check("live:peer", "wrong-password-xxxxxxx"), mux_socket.sockname)
    for _ in range(20):
        spoofer.send(b"\x80" + bytes(171), mux_socket.sockname)  # SRTP-looking
        spoofer.send(b"\x17\xfe\xfd" + bytes(40), mux_socket.sockname)  # DTLS-looking
    await settle(mux_socket, 42)
    assert [addr for _, addr in call.received] == [genuine.addr]
    assert spoofer.addr not in mux_socket.routes
    assert mux_socket.stats.bad_integrity == 1 and mux_socket.stats.unrouted == 40
    # Only once an authenticated check succeeds from it does an address carry media.
    spoofer.send(check("live:peer", "s" * 22), mux_socket.sockname)
    spoofer.send(b"\x80after", mux_socket.sockname)
    await settle(mux_socket, 44)
    assert call.received[-1] == (b"\x80after", spoofer.addr)


async def test_a_flood_of_unknown_usernames_stays_bounded_and_live_media_flows(
        mux_socket: MuxSocket) -> None:
    transport, call = attach_call(mux_socket, "real", "r" * 22)
    caller = Peer()
    caller.send(check("real:peer", "r" * 22), mux_socket.sockname)
    await settle(mux_socket, 1)
    flooders = [Peer() for _ in range(40)]  # many source addresses
    sent = 0
    for round_ in range(25):
        for i, flooder in enumerate(flooders):
            flooder.send(check(f"u{round_:02d}{i:02d}:x", "n" * 22), mux_socket.sockname)
            sent += 1
        caller.send(b"\x80media%d" % round_, mux_socket.sockname)
        await asyncio.sleep(0)
    await settle(mux_socket, 1 + sent + 25)
    stats = mux_socket.stats
    assert stats.unknown_username + stats.rate_limited == sent
    assert stats.rate_limited > 0  # the bucket stopped most of it unread
    assert len(mux_socket.pending) <= mux_socket.limits.pending_entries
    assert mux_socket.ufrags.keys() == {"real"} and list(mux_socket.routes) == [caller.addr]
    media = [data for data, _ in call.received if data.startswith(b"\x80media")]
    assert media == [b"\x80media%d" % i for i in range(25)]  # every live packet, in order
    for flooder in flooders:
        flooder.sock.close()
    caller.sock.close()
    transport.close()


async def test_a_check_that_raced_its_call_is_replayed_once_the_call_registers(
        mux_socket: MuxSocket) -> None:
    peer = Peer()
    peer.send(check("late:peer", "l" * 22), mux_socket.sockname)
    await settle(mux_socket, 1)
    assert len(mux_socket.pending) == 1
    transport, call = attach_call(mux_socket, "late", "l" * 22)
    assert [addr for _, addr in call.received] == [peer.addr]
    assert mux_socket.pending == {} and mux_socket.stats.pending_replayed == 1
    transport.close()


async def test_a_response_is_delivered_only_from_where_the_request_went(
        mux_socket: MuxSocket) -> None:
    transport, call = attach_call(mux_socket, "resp", "q" * 22)
    peer, other = Peer(), Peer()
    request = stun.Message(message_method=stun.Method.BINDING,
                           message_class=stun.Class.REQUEST,
                           transaction_id=random_transaction_id())
    transport.sendto(bytes(request), peer.addr)
    assert peer.recv() == bytes(request)
    response = stun.Message(message_method=stun.Method.BINDING,
                            message_class=stun.Class.RESPONSE,
                            transaction_id=request.transaction_id)
    response.attributes["XOR-MAPPED-ADDRESS"] = peer.addr
    response.add_message_integrity(b"remote-pwd")
    other.send(bytes(response), mux_socket.sockname)  # right id, wrong address
    peer.send(bytes(response), mux_socket.sockname)
    await settle(mux_socket, 2)
    assert [addr for _, addr in call.received] == [peer.addr]
    assert mux_socket.routes == {peer.addr: transport}  # a verified answer validates it
    transport.close()


def test_a_port_in_use_fails_to_open_and_leaves_nothing_bound() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            UdpMux.open(port, ["127.0.0.1"])


@pytest.mark.parametrize("flags, code", [
    (["--rtc-udp-port", "70000"], "rtc_udp_port_invalid"),
    (["--rtc-udp-port", "40000", "--rtc-ports", "40000-40099"], "rtc_udp_port_invalid"),
    (["--rtc-udp-port", "40000", "--workers", "2"], "rtc_udp_port_workers"),
])
def test_bad_flags_are_one_line_start_up_errors(flags: list[str], code: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "signaling", "--ice-host", "127.0.0.1", "--workers", "1",
         "--port", "1", *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error [{code}]: "), result.stderr


def test_a_port_in_use_is_a_start_up_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "signaling", "--ice-host", "127.0.0.1", "--workers", "1",
             "--port", "1", "--rtc-udp-port", str(port)],
            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("error [rtc_udp_port_in_use]: "), result.stderr


# -- real calls on one port -----------------------------------------------------------------


@pytest.fixture
def udp_mux_on_loopback() -> Iterator[UdpMux]:
    mux = UdpMux.open(0, ["127.0.0.1"])
    assert use_udp_mux(mux)
    yield mux
    use_udp_mux(None)
    mux.close()


class Flood:
    """STUN checks with unknown usernames from many source ports, a few thousand a second,
    sent from a thread until stopped."""

    def __init__(self, target: tuple[str, int], sources: int = 64) -> None:
        self.target = target
        self.socks = [Peer() for _ in range(sources)]
        self.packets = [check(f"f{i:03d}:x", "n" * 22) for i in range(256)]
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for i in range(20):
                sock = self.socks[(self.sent + i) % len(self.socks)].sock
                sock.sendto(self.packets[(self.sent + i) % len(self.packets)], self.target)
            self.sent += 20
            time.sleep(0.005)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for peer in self.socks:
            peer.sock.close()


async def test_two_calls_share_one_port_and_their_audio_stays_apart(
        start_agent: AgentFactory, udp_mux_on_loopback: UdpMux) -> None:
    """... while a flood of checks with unknown usernames from 64 addresses hits the port."""
    mux = udp_mux_on_loopback
    running = await start_agent(settings=AgentSettings(rtc_udp_port=mux.port))
    seconds = 3.0
    # Signals longer than the recording: no window of silence after an echo's end.
    callers = [Caller(running.url, make_test_signal(seconds + 2, seed=11 + i))
               for i in range(2)]
    try:
        async with aiohttp.ClientSession() as http:
            for caller in callers:
                assert await caller.offer(http), caller.answer
        for caller in callers:
            assert await caller.wait_connected(15)
            assert host_candidates(caller.answer) == [("127.0.0.1", mux.port)]
        async with aiohttp.ClientSession() as http:
            for path in ("/health", "/v1/realtime/config"):
                async with http.get(running.url + path) as response:
                    shown = (await response.json())["rtc"]
                assert shown == {"ports": None, "udp_port": mux.port, "advertise": []}
        shared = mux.sockets["127.0.0.1"]
        assert shared.calls == 2 and len(shared.routes) == 2
        with Flood(shared.sockname) as flood:
            await asyncio.sleep(seconds)
        # (most of it: a loaded machine's kernel may drop some of a flood, as it should)
        await wait_until(lambda: shared.stats.unknown_username + shared.stats.rate_limited
                         >= flood.sent // 2)
        assert shared.stats.rate_limited > 0 and flood.sent > 1000
        assert len(shared.pending) <= shared.limits.pending_entries
        assert len(shared.routes) == 2  # the flood validated no address
        for i, caller in enumerate(callers):
            own = measure_echo(caller.signal, caller.heard, RATE)
            other = measure_echo(callers[1 - i].signal, caller.heard, RATE)
            assert own.correlation >= 0.9, own
            assert other.correlation < 0.3, other
    finally:
        for caller in callers:
            await caller.close()
    await wait_until(lambda: all_freed(running))
    await wait_until(lambda: mux.sockets["127.0.0.1"].calls == 0)
    assert mux.sockets["127.0.0.1"].routes == {}
    assert mux.sockets["127.0.0.1"].stats.routed > 0
