"""The SIP user agent's abuse limits (signaling/sip/guard.py) and its leak accounting.

An INVITE flood from one address is rate-limited (503 with Retry-After, then silence) while an
established call from elsewhere keeps its audio; an in-dialog request from an address that is
neither the dialog's peer nor its proxy gets 403 and the call goes on; after a run of bad
input (RFC 4475-style torture messages, truncated and oversized ones, wrong Content-Length,
unknown dialogs, unusable SDP, a flood) the SIP section of /health counts no transaction,
dialog or leg, and the log holds no traceback. Spoofers and flooders are raw UDP sockets on
other loopback addresses (127.0.0.2-5), which Linux routes to `lo` without set-up.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import secrets
import socket
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.telephony.codec import PCMU
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.sip.config import SipConfig, add_arguments, config_from_args
from signaling.sip.guard import GuardSettings, InviteLimiter, Verdict
from signaling.sip.message import SipRequest, SipResponse
from signaling.sip.timers import TimerSettings
from tests.sip import scenarios
from tests.sip.helpers import (
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    TcpSipPeer,
    establish,
    hang_up,
    run_sipp,
    sdp_offer,
    write_mulaw_wav,
)
from tests.sip.test_sip_message import INVALID, VALID, wire
from tests.support.agents import wait_until
from tests.support.clock import FakeClock

FAST = TimerSettings(t1=0.05, t2=0.2, t4=0.25)


# -- the limiter on its own ------------------------------------------------------------------


def test_the_bucket_admits_a_burst_then_the_rate_then_refuses_and_then_drops() -> None:
    clock = FakeClock()
    limiter = InviteLimiter(GuardSettings(invite_rate=2, invite_burst=3, reply_cap=2), clock)
    verdicts = [limiter.decide("192.0.2.1").verdict for _ in range(7)]
    assert verdicts == [Verdict.ADMIT] * 3 + [Verdict.REFUSE] * 2 + [Verdict.DROP] * 2
    assert limiter.decide("192.0.2.2").verdict is Verdict.ADMIT  # another address: its own
    clock.advance(0.25)  # half a token: still refused, and told to come back in a second
    decision = limiter.decide("192.0.2.1")
    assert decision.verdict is Verdict.DROP  # the cap holds for the rest of that second
    clock.advance(1.0)
    assert [limiter.decide("192.0.2.1").verdict for _ in range(3)] == [
        Verdict.ADMIT, Verdict.ADMIT, Verdict.REFUSE]
    refused = InviteLimiter(GuardSettings(invite_rate=0.5, invite_burst=1), clock)
    refused.decide("a")
    assert refused.decide("a").retry_after == 2  # a token every 2 s
    assert limiter.counters == {"invites_limited": 3, "invites_dropped": 3}


def test_the_table_is_bounded_and_forgets_the_least_recent_address() -> None:
    limiter = InviteLimiter(GuardSettings(invite_rate=1, invite_burst=1, table_size=2),
                            FakeClock())
    for address in ("a", "b", "a", "c"):  # "b" is the least recently seen when "c" comes
        limiter.decide(address)
    assert len(limiter) == 2 and limiter.counters["addresses_evicted"] == 1
    assert limiter.decide("a").verdict is Verdict.REFUSE  # still remembered
    assert limiter.decide("b").verdict is Verdict.ADMIT  # forgotten: a full bucket again
    assert InviteLimiter(GuardSettings(invite_rate=0), FakeClock()).decide("x").verdict \
        is Verdict.ADMIT  # 0: no limit


def test_refusals_are_logged_once_a_second_at_most(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    limiter = InviteLimiter(GuardSettings(invite_rate=1, invite_burst=1), clock)
    with caplog.at_level(logging.WARNING, logger="signaling.sip.guard"):
        for _ in range(500):
            limiter.decide("192.0.2.7")
        clock.advance(1.0)
        for _ in range(5):
            limiter.decide("192.0.2.7")
    lines = [r.getMessage() for r in caplog.records if r.name == "signaling.sip.guard"]
    assert len(lines) == 2, lines
    assert "1 new INVITE(s)" in lines[0] and "499 new INVITE(s)" in lines[1], lines


def test_the_flags_set_the_limits_and_refuse_nonsense() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--sip-listen", "127.0.0.1:0", "--sip-invite-rate", "2.5",
                              "--sip-invite-burst", "7", "--sip-invite-table", "100"])
    config = config_from_args(args)
    assert config is not None
    assert config.guard == GuardSettings(invite_rate=2.5, invite_burst=7, table_size=100)
    default = config_from_args(parser.parse_args(["--sip-listen", "127.0.0.1:0"]))
    assert default is not None and default.guard == GuardSettings()
    for flags in (["--sip-invite-rate", "-1"], ["--sip-invite-rate", "nan"],
                  ["--sip-invite-burst", "0"], ["--sip-invite-table", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["--sip-listen", "127.0.0.1:0", *flags])


# -- on the wire -------------------------------------------------------------------------------


async def peer_at(address: str) -> SipPeer:
    """A raw SIP peer on another loopback address."""
    _, peer = await asyncio.get_running_loop().create_datagram_endpoint(
        SipPeer, local_addr=(address, 0))
    return peer


def forged(request: SipRequest) -> SipRequest:
    """The caller's own request, word for word, sent by someone else: `rport` added so the
    answer comes back to the sender's socket (RFC 3581), nothing else changed."""
    vias = request.headers.get_all("via")
    request.headers.replace_values("via", [vias[0] + ";rport", *vias[1:]])
    return request


def as_sender(dialogue: Dialogue, port: int) -> Dialogue:
    """The same dialog's ids in a request whose Via names another port."""
    return dataclasses.replace(dialogue, peer_port=port)


def flood_invite(index: int, port: int, media_port: int, formats: str = "18") -> bytes:
    dialogue = Dialogue(port, ("127.0.0.1", 5060), call_id=f"flood-{index}-{secrets.token_hex(4)}")
    return dialogue.request("INVITE", body=sdp_offer(media_port, formats)).to_bytes()


async def test_an_invite_flood_gets_503_with_retry_after_then_silence(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    clock = FakeClock()  # time stands still: exactly the burst is admitted
    server.ua.guard = InviteLimiter(GuardSettings(invite_rate=5, invite_burst=10), clock)
    flooder = await peer_at("127.0.0.3")
    for index in range(60):
        flooder.send(flood_invite(index, flooder.port, 4000), server.sip)
    await wait_until(lambda: server.ua.guard.counters["invites_dropped"] == 40)
    await flooder.drain(0.5)
    finals = [m for m in flooder.log if isinstance(m, SipResponse) and m.status >= 200]
    statuses = sorted(dict((m.call_id, m.status) for m in finals).values())  # no resends
    assert statuses == [488] * 10 + [503] * 10, statuses  # the burst, then REPLY_CAP 503s
    retry = {m.headers.get("retry-after") for m in finals if m.status == 503}
    assert retry == {"1"}  # 5 tokens a second: the next in under a second
    # Another address is not affected; the flooder is again once a token has come back.
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    call, _, _ = await establish(server, peer, sdp_offer(probe.port))
    clock.advance(0.2)
    flooder.send(flood_invite(99, flooder.port, 4000), server.sip)
    assert (await flooder.response(488)).status == 488
    call.cseq += 1
    peer.send(call.request("BYE"), server.sip)
    await peer.response(200, method="BYE")
    await wait_until(server.idle)
    for closing in (flooder, peer, probe):
        closing.close()


@pytest.mark.slow
@pytest.mark.interop
async def test_an_established_call_keeps_its_echo_through_an_invite_flood(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    """sipp holds a PCMU call with audio (its own process, real time) while 127.0.0.3 sends
    thousands of INVITEs: the echo still comes back whole."""
    probe = await RtpProbe.open()
    signal = make_test_signal(4.0, 8000)
    sent = PCMU.decode(write_mulaw_wav(tmp_path / "speech.wav", signal))
    xml = scenarios.call_with_echo("speech.wav", 5000).replace("__MEDIA_PORT__", str(probe.port))
    call = asyncio.create_task(run_sipp(sip_server.sip, tmp_path, "-m", "1", scenario=xml,
                                        timeout=30))
    flooder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flooder.bind(("127.0.0.3", 0))
    flooder.setblocking(False)
    port = flooder.getsockname()[1]
    sent_invites = 0
    try:
        await wait_until(lambda: sip_server.sip_legs() == 1, timeout=15)
        for index in range(3000):  # about 1000 a second for 3 s
            try:
                flooder.sendto(flood_invite(index, port, 4000), sip_server.sip)
                sent_invites += 1
            except BlockingIOError:
                pass
            if index % 10 == 9:
                await asyncio.sleep(0.01)
        run = await call
    finally:
        flooder.close()
    assert run.returncode == 0, run.explain()
    counters = sip_server.ua.guard.counters
    over_budget = sip_server.ua.budget.counters["messages_dropped"]  # budget.py, unparsed
    assert (counters["invites_limited"] + counters["invites_dropped"] + over_budget
            >= sent_invites - 200)
    received = probe.audio()
    echo = measure_echo(sent.astype(np.float32) / 32768, received[:len(sent)], 8000)
    print(f"\necho through a flood of {sent_invites} INVITEs: correlation "
          f"{echo.correlation:.3f}, holes {echo.holes}, refused {dict(counters)}")
    assert echo.correlation >= 0.8, echo
    await wait_until(sip_server.quiet)
    probe.close()


async def test_spoofed_bye_reinvite_and_cancel_get_403_and_the_call_goes_on(
    start_sip: SipServerFactory,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST, ring_seconds=0.5))
    peer, probe, spoofer = await SipPeer.open(), await RtpProbe.open(), await peer_at("127.0.0.2")
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    peer.send(invite, server.sip)
    await peer.response(180)
    # CANCEL while it rings, from elsewhere: refused; the call is answered as if none came.
    assert invite.top_via is not None
    spoofer.send(forged(dialogue.request("CANCEL", branch=invite.top_via.branch)), server.sip)
    assert (await spoofer.response()).status == 403
    ok = await peer.response(200)
    peer.send(dialogue.ack_for(invite, ok), server.sip)
    spoofer.send(forged(dialogue.request("BYE", cseq=5)), server.sip)
    assert (await spoofer.response()).status == 403
    spoofer.send(forged(dialogue.request("INVITE", cseq=6, body=sdp_offer(
        probe.port, direction="inactive"))), server.sip)
    assert (await spoofer.response()).status == 403
    await asyncio.sleep(0.3)
    assert server.sip_legs() == 1 and server.ua.counters["spoofed_in_dialog"] == 3
    (leg,) = list(server.agent.legs)
    assert leg.stats()["direction"] == "sendrecv"  # the forged hold changed nothing
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/health") as reply:
            sip = (await reply.json())["sip"]
    assert sip["spoofed_in_dialog"] == 3 and sip["dialogs"] == 1 and sip["legs"] == 1
    await hang_up(server, peer, dialogue, probe, spoofer)  # the real caller still can


async def test_in_dialog_requests_through_the_proxy_or_from_the_contact_are_taken(
    start_sip: SipServerFactory,
) -> None:
    """A caller at 127.0.0.5 reached through a proxy at 127.0.0.4 that record-routes: a
    BYE by either path is the dialog's own."""
    server = await start_sip(config=SipConfig(listen_port=0, timers=FAST))
    proxy, caller, probe = (await peer_at("127.0.0.4"), await peer_at("127.0.0.5"),
                            await RtpProbe.open())
    for direct in (False, True):
        dialogue = Dialogue(proxy.port, server.sip)
        route = [("Record-Route", f"<sip:127.0.0.4:{proxy.port};lr>")]
        invite = dialogue.request("INVITE", body=sdp_offer(probe.port), headers=route)
        invite.headers.replace_values("contact", [f"<sip:caller@127.0.0.5:{caller.port}>"])
        proxy.send(invite, server.sip)
        ok = await proxy.response(200)
        proxy.send(dialogue.ack_for(invite, ok), server.sip)
        dialogue.cseq += 1
        via = caller if direct else proxy
        sender = as_sender(dialogue, via.port)
        via.send(sender.request("BYE"), server.sip)
        assert (await via.response(method="BYE")).status == 200
        await wait_until(server.quiet)
    assert server.ua.counters["spoofed_in_dialog"] == 0
    for closing in (proxy, caller, probe):
        closing.close()


# -- leak accounting ---------------------------------------------------------------------------


async def health_sip(server: SipServer) -> dict[str, object]:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "/health") as reply:
            assert reply.status == 200
            body = await reply.json()
    sip = body["sip"]
    assert isinstance(sip, dict)
    return sip


@pytest.mark.slow
async def test_after_a_run_of_bad_input_nothing_is_left_and_nothing_was_raised(
    start_sip: SipServerFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    config = SipConfig(listen_port=0, timers=FAST,
                       guard=GuardSettings(invite_rate=5, invite_burst=10))
    server = await start_sip(config=config)
    peer, probe, flooder = await SipPeer.open(), await RtpProbe.open(), await peer_at("127.0.0.3")
    # RFC 4475-style torture: every valid and invalid message of the parser's own tests.
    for text in VALID.values():
        peer.send(wire(text), server.sip)
    for text, _, _ in INVALID.values():
        peer.send(wire(text) if "\n\n" in text else text.encode(), server.sip)
    # Truncated at every 37th byte, a Content-Length too long and too short.
    good = Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(probe.port))
    data = good.to_bytes()
    for cut in range(1, len(data), 37):
        peer.send(data[:cut], server.sip)
    for length in (len(good.body) + 40, 3):
        broken = data.replace(f"Content-Length: {len(good.body)}".encode(),
                              f"Content-Length: {length}".encode())
        peer.send(broken, server.sip)
    # Oversized over TCP, a BYE and a CANCEL of no dialog, SDP with no usable codec.
    tcp = await TcpSipPeer.connect(server.sip)
    huge = Dialogue(tcp.port, server.sip, transport="TCP").request("MESSAGE",
                                                                   body=b"x" * 70_000)
    tcp.send(huge)
    nobody = Dialogue(peer.port, server.sip, to_tag="nosuchtag")
    peer.send(nobody.request("BYE"), server.sip)
    assert (await peer.response(481, method="BYE")).status == 481
    peer.send(Dialogue(peer.port, server.sip).request("CANCEL"), server.sip)
    assert (await peer.response(481, method="CANCEL")).status == 481
    peer.send(Dialogue(peer.port, server.sip).request("INVITE", body=sdp_offer(probe.port,
                                                                               "18 3")),
              server.sip)
    assert (await peer.response(488)).status == 488
    # A flood from one address, half of it calls that would be answered.
    for index in range(200):
        flooder.send(flood_invite(index, flooder.port, probe.port, "0" if index % 2 else "18"),
                     server.sip)
    await wait_until(lambda: server.ua.guard.counters["invites_limited"] > 0)
    await tcp.close()
    # Everything ends: calls admitted from the flood get no ACK (BYE after 64*T1, whose own
    # transaction then times out), transactions run out their timers.
    await wait_until(lambda: server.idle(), timeout=30)
    sip = await health_sip(server)
    assert sip["transactions"] == {"server": 0, "client": 0}, sip
    assert (sip["dialogs"], sip["legs"], sip["tasks"], sip["internal_errors"]) == (0, 0, 0, 0)
    assert server.ua.counters["malformed"] >= len(INVALID)
    limit = sip["invite_limit"]
    assert isinstance(limit, dict) and limit["invites_limited"] > 0
    assert "Traceback" not in caplog.text and not any(r.exc_info for r in caplog.records)
    for closing in (peer, probe, flooder):
        closing.close()
