"""The SIP user agent's flood limits for every message (signaling/sip/budget.py): the
per-source message budget and the cap on live server transactions on their own (a clock the
test moves), then on the wire: raw UDP from 127.0.0.2 floods every kind of message (OPTIONS,
REGISTER, MESSAGE, SUBSCRIBE, an unknown method, stray responses) while sipp holds a PCMU
echo call from 127.0.0.1; and SIP/TCP from 127.0.0.2: connections past the per-address cap
closed, a connection that does not deliver a whole message in time closed."""

from __future__ import annotations

import argparse
import asyncio
import gc
import secrets
import ssl
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from agent.telephony.codec import PCMU
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.sip.budget import BudgetSettings, MessageBudget, TransactionCap
from signaling.sip.config import SipConfig, add_arguments, config_from_args
from signaling.sip.message import SipResponse
from signaling.sip.timers import ManualTimers, TimerSettings
from signaling.sip.tls import SipTlsSettings
from signaling.sip.transaction import TransactionLayer
from tests.sip import scenarios
from tests.sip.helpers import (
    HOST,
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServerFactory,
    run_sipp,
    write_mulaw_wav,
)
from tests.support.agents import wait_until
from tests.support.clock import FakeClock
from tests.support.tls import self_signed

FLOODER = "127.0.0.2"

# -- the budget on its own -----------------------------------------------------------------------


def test_the_budget_admits_a_burst_then_the_rate_then_drops() -> None:
    clock = FakeClock()
    budget = MessageBudget(BudgetSettings(message_rate=10, message_burst=5), clock)
    assert [budget.admit("192.0.2.1") for _ in range(7)] == [True] * 5 + [False] * 2
    assert budget.admit("192.0.2.2")  # another address has its own bucket
    clock.advance(0.25)  # 2.5 tokens back: two messages
    assert [budget.admit("192.0.2.1") for _ in range(3)] == [True, True, False]
    clock.advance(60)  # never more than the burst
    assert sum(budget.admit("192.0.2.1") for _ in range(10)) == 5
    assert budget.counters["messages_dropped"] == 8
    unlimited = MessageBudget(BudgetSettings(message_rate=0), clock)
    assert all(unlimited.admit("192.0.2.1") for _ in range(10_000)) and len(unlimited) == 0


def test_the_budget_table_is_bounded_and_forgets_the_least_recent_address() -> None:
    clock = FakeClock()
    budget = MessageBudget(BudgetSettings(message_rate=1, message_burst=1, table_size=3), clock)
    for index in range(1000):
        budget.admit(f"10.0.{index // 256}.{index % 256}")
    assert len(budget) == 3 and budget.counters["addresses_evicted"] == 997
    assert not budget.admit("10.0.3.231")  # the most recent one is still remembered


def test_the_transaction_cap_refuses_a_second_s_worth_then_drops() -> None:
    clock = FakeClock()
    cap = TransactionCap(BudgetSettings(max_transactions=100, reply_cap=3), clock)
    assert cap.decide(99) == "admit"
    assert [cap.decide(100) for _ in range(5)] == ["refuse"] * 3 + ["drop"] * 2
    clock.advance(1.0)
    assert cap.decide(250) == "refuse"
    assert cap.decide(10) == "admit"
    assert TransactionCap(BudgetSettings(max_transactions=0), clock).decide(10**6) == "admit"
    assert dict(cap.counters) == {"over_cap_refused": 4, "over_cap_dropped": 2}


def test_the_flags_set_the_budget_and_refuse_nonsense() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args([
        "--sip-listen", "127.0.0.1:0", "--sip-message-rate", "50", "--sip-message-burst", "70",
        "--sip-max-transactions", "900", "--sip-tcp-per-address", "4",
        "--sip-header-timeout", "2.5", "--sip-invite-table", "100"]))
    assert config is not None
    assert config.budget == BudgetSettings(message_rate=50, message_burst=70,
                                           max_transactions=900, table_size=100,
                                           tcp_per_address=4, header_timeout=2.5)
    default = config_from_args(parser.parse_args(["--sip-listen", "127.0.0.1:0"]))
    assert default is not None and default.budget == BudgetSettings()
    for flags in (["--sip-message-rate", "-1"], ["--sip-message-rate", "nan"],
                  ["--sip-message-burst", "0"], ["--sip-max-transactions", "x"],
                  ["--sip-tcp-per-address", "0"], ["--sip-header-timeout", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--sip-listen", "127.0.0.1:0", *flags])


def test_an_ended_server_transaction_is_freed_without_a_garbage_collection() -> None:
    """What a request leaves behind goes with its transaction: once Timer J ends an OPTIONS
    transaction, nothing holds it, not even a reference cycle waiting for a full collection
    (which an idle server may not run for a long time: a flood's memory stayed)."""
    timers = ManualTimers()
    layer = TransactionLayer(timers, TimerSettings())
    sent: list[bytes] = []
    gc.disable()
    try:
        alive = []
        for index in range(50):
            request = Dialogue(5060, ("192.0.2.9", 5060)).request(
                "OPTIONS", branch=f"z9hG4bKgone{index}")
            tx = layer.new_server(request, sent.append, reliable=False)
            tx.respond(SipResponse(headers=request.headers, status=200, reason="OK"))
            alive.append(weakref.ref(tx))
            del tx, request
        assert len(layer.servers) == 50
        timers.advance(40)  # past Timer J (64*T1)
        assert not layer.servers
        assert [ref for ref in alive if ref() is not None] == []
    finally:
        gc.enable()


# -- a flood of every method on the wire ---------------------------------------------------------


class TimedProbe(RtpProbe):
    """An RTP probe that also notes when each packet came."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.arrivals.append(time.monotonic())
        super().datagram_received(data, addr)

    def worst_gap(self, start: float, end: float) -> float:
        """The longest time without a packet between `start` and `end`."""
        times = [start, *(t for t in self.arrivals if start < t < end), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))


FLOOD_METHODS = ("OPTIONS", "REGISTER", "MESSAGE", "SUBSCRIBE", "FROBNICATE", "response")


def flood_message(kind: str, port: int, server: tuple[str, int]) -> bytes:
    """One out-of-dialog request of `kind` from FLOODER, or a response no one asked for."""
    dialogue = Dialogue(port, server, call_id=f"flood-{secrets.token_hex(6)}")
    request = dialogue.request("OPTIONS" if kind == "response" else kind)
    data = request.to_bytes().replace(f"{HOST}:{port}".encode(), f"{FLOODER}:{port}".encode())
    if kind != "response":
        return data
    head, _, _ = data.partition(b"\r\n")
    return data.replace(head, b"SIP/2.0 200 OK", 1)


async def test_a_flood_of_every_method_is_capped_and_a_live_call_keeps_its_audio(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    """1,800 messages from 127.0.0.2 (300 of each kind, round robin) in about a second while
    sipp's echo call from 127.0.0.1 plays 4 s of speech: live server transactions never pass
    the cap, the flood gets 503s with Retry-After and then silence, and the call's echo comes
    back whole and without a long gap."""
    cap = 120
    server = await start_sip(config=SipConfig(listen_port=0, budget=BudgetSettings(
        message_rate=100, message_burst=400, max_transactions=cap, reply_cap=50)))
    probe = await TimedProbe.open()
    signal = make_test_signal(4.0, 8000)
    sent = PCMU.decode(write_mulaw_wav(tmp_path / "speech.wav", signal))
    xml = scenarios.call_with_echo("speech.wav", 5000).replace("__MEDIA_PORT__", str(probe.port))
    call = asyncio.create_task(run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml,
                                        timeout=30))
    _, flooder = await asyncio.get_running_loop().create_datagram_endpoint(
        SipPeer, local_addr=(FLOODER, 0))
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(server.ua.transactions.servers))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await wait_until(lambda: server.sip_legs() == 1 and len(probe.packets) > 25, timeout=15)
        begun = time.monotonic()
        for index in range(1800):
            flooder.send(flood_message(FLOOD_METHODS[index % 6], flooder.port, server.sip),
                         server.sip)
            if index % 30 == 29:
                await asyncio.sleep(0.01)
        await wait_until(lambda: server.ua.budget.counters["messages_dropped"] > 0)
        ended = time.monotonic()
        run = await call
    finally:
        watcher.cancel()
        flooder.close()
    assert run.returncode == 0, run.explain()
    answered = [m for m in flooder.log if isinstance(m, SipResponse)]
    refused = [m for m in answered if m.status == 503]
    stats = server.ua.stats()["budget"]
    print(f"\nflood: {len(answered)} answers ({len(refused)} 503), peak {peak} live server "
          f"transactions (cap {cap}), {stats}, worst gap "
          f"{probe.worst_gap(begun, ended) * 1000:.0f} ms")
    assert peak <= cap + 1  # the call's own BYE may pass the cap
    assert refused and {m.headers.get("retry-after") for m in refused} == {"5"}
    assert len(answered) < 1800 - 5 * 300 * 0.5  # most of the flood got no answer at all
    assert isinstance(stats, dict) and stats["messages_dropped"] > 0
    assert stats["over_cap_refused"] == len(refused)
    echo = measure_echo(sent.astype(np.float32) / 32768, probe.audio()[:len(sent)], 8000)
    assert echo.correlation >= 0.8, echo
    assert probe.worst_gap(begun, ended) < 1.0
    await wait_until(server.quiet)
    probe.close()


# -- SIP/TCP ---------------------------------------------------------------------------------------


async def connect_from(source: str, to: tuple[str, int]) -> tuple[asyncio.StreamReader,
                                                                   asyncio.StreamWriter]:
    return await asyncio.open_connection(*to, local_addr=(source, 0))


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 5.0) -> bool:
    """True when the server closes the connection within `timeout` (it sends nothing)."""
    try:
        return await asyncio.wait_for(reader.read(65536), timeout) == b""
    except ConnectionResetError:
        return True
    except asyncio.TimeoutError:
        return False


def options(port: int, server: tuple[str, int], source: str = HOST) -> bytes:
    dialogue = Dialogue(port, server, transport="TCP")
    data = dialogue.request("OPTIONS").to_bytes()
    return data.replace(f"{HOST}:{port}".encode(), f"{source}:{port}".encode())


async def answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   server: tuple[str, int], source: str) -> bool:
    port = int(writer.get_extra_info("sockname")[1])
    writer.write(options(port, server, source))
    try:
        line = await asyncio.wait_for(reader.readline(), 5.0)
    except (asyncio.TimeoutError, ConnectionResetError):
        return False
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
    return line.startswith(b"SIP/2.0 200")


async def test_tcp_connections_past_the_per_address_cap_are_closed(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, budget=BudgetSettings(
        tcp_per_address=3)))
    kept = [await connect_from(FLOODER, server.sip) for _ in range(3)]
    for reader, writer in kept:  # each accepted and served
        assert await answered(reader, writer, server.sip, FLOODER)
    extra = [await connect_from(FLOODER, server.sip) for _ in range(2)]
    for reader, _ in extra:
        assert await closed_by_server(reader)
    elsewhere = await connect_from(HOST, server.sip)  # another address is not affected
    assert await answered(*elsewhere, server.sip, HOST)
    transport = server.ua.stats()["transport"]
    assert isinstance(transport, dict) and transport["tcp_refused_per_address"] == 2
    kept[0][1].close()  # one closed: room for one more from that address
    await wait_until(lambda: len(server.ua.transports.connections) == 3)
    again = await connect_from(FLOODER, server.sip)
    assert await answered(*again, server.sip, FLOODER)
    for _, writer in [*kept[1:], *extra, elsewhere, again]:
        writer.close()


async def test_a_tcp_connection_without_a_whole_message_in_time_is_closed(
    start_sip: SipServerFactory,
) -> None:
    """A connection that has delivered its message stays (its deadline is met); one that
    sends nothing and one that stops half-way through its headers are closed after the
    header deadline, which runs from the accept and is not pushed back by trickled bytes;
    the first one too, once a later message of its stops half-way."""
    server = await start_sip(config=SipConfig(listen_port=0, budget=BudgetSettings(
        header_timeout=0.5)))
    good = await connect_from(FLOODER, server.sip)
    assert await answered(*good, server.sip, FLOODER)
    silent_reader, silent = await connect_from(FLOODER, server.sip)
    half_reader, half = await connect_from(FLOODER, server.sip)
    port = int(half.get_extra_info("sockname")[1])
    message = options(port, server.sip, FLOODER)
    half.write(message[:60])
    closing = asyncio.create_task(closed_by_server(half_reader))
    for byte in message[60:]:  # a byte every 20 ms: whole only after about 5 s
        if closing.done():
            break
        half.write(bytes([byte]))
        await asyncio.sleep(0.02)
    assert await closing  # closed while still trickling: bytes do not push the deadline
    assert await closed_by_server(silent_reader)
    transport = server.ua.stats()["transport"]
    assert isinstance(transport, dict) and transport["tcp_header_timeouts"] == 2
    assert await answered(*good, server.sip, FLOODER)  # well past its own deadline: served
    good[1].write(options(port, server.sip, FLOODER)[:60])  # a later message, half sent
    assert await closed_by_server(good[0])
    for writer in (good[1], silent, half):
        writer.close()


async def test_tls_connections_meet_the_same_cap_and_deadline(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    """Over TLS (the handshake done): one connection per address allowed here, a second from
    that address closed; the first, silent after its handshake, closed at the deadline; then
    the address may connect again and is served."""
    cert, key = self_signed(tmp_path)
    server = await start_sip(config=SipConfig(
        listen_port=0, tls=SipTlsSettings(str(cert), str(key), HOST, 0),
        budget=BudgetSettings(tcp_per_address=1, header_timeout=0.5)))
    context = ssl.create_default_context(cafile=str(cert))
    tls_port = server.ua.port_for("TLS")

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(HOST, tls_port, ssl=context, server_hostname=HOST,
                                             local_addr=(FLOODER, 0))

    first = await connect()  # and silent after its handshake
    second = await connect()
    assert await closed_by_server(second[0])  # the address's one connection is taken
    assert await closed_by_server(first[0])  # no message within the deadline
    transport = server.ua.stats()["transport"]
    assert isinstance(transport, dict)
    assert (transport["tcp_refused_per_address"], transport["tcp_header_timeouts"]) == (1, 1)
    await wait_until(lambda: not server.ua.transports.connections)
    third = await connect()
    assert await answered(*third, (HOST, tls_port), FLOODER)
    for _, writer in (first, second, third):
        writer.close()
