"""RFC 3261 transaction timers on a fake clock: what is sent when, and when each gives up."""

from __future__ import annotations

import asyncio

from signaling.sip.message import Headers, SipRequest, SipResponse, parse_message
from signaling.sip.timers import ManualTimers, TimerHandle, TimerSettings
from signaling.sip.transaction import (
    ACCEPTED,
    COMPLETED,
    CONFIRMED,
    PROCEEDING,
    TERMINATED,
    TRYING,
    InviteClientTransaction,
    InviteServerTransaction,
    NonInviteClientTransaction,
    NonInviteServerTransaction,
    TransactionLayer,
    retransmit_2xx,
    server_key,
)

T = TimerSettings()  # T1 0.5 s, T2 4 s, T4 5 s: Timers B/F/H/J/L/M 32 s


def request(method: str, branch: str = "z9hG4bKabc", cseq_method: str | None = None,
            to_tag: str | None = None) -> SipRequest:
    headers = Headers()
    headers.add("Via", f"SIP/2.0/UDP 192.0.2.1:5060;branch={branch}")
    headers.add("From", "<sip:a@example.com>;tag=from1")
    headers.add("To", "<sip:b@example.com>" + (f";tag={to_tag}" if to_tag else ""))
    headers.add("Call-ID", "call-1")
    headers.add("CSeq", f"1 {cseq_method or method}")
    return SipRequest(headers=headers, method=method, uri="sip:b@example.com")


def response(to: SipRequest, status: int) -> SipResponse:
    headers = Headers()
    for name in ("via", "from", "call-id", "cseq"):
        headers.add(name, to.headers.get(name) or "")
    headers.add("To", (to.headers.get("to") or "") + (";tag=t" if status > 100 else ""))
    return SipResponse(headers=headers, status=status, reason="X")


class Wire:
    """What a transaction sent, with the fake time of each send."""

    def __init__(self, timers: ManualTimers) -> None:
        self.timers = timers
        self.sent: list[tuple[float, bytes]] = []

    def __call__(self, data: bytes) -> None:
        self.sent.append((self.timers.now(), data))

    def times(self) -> list[float]:
        return [round(at, 3) for at, _ in self.sent]

    def first_lines(self) -> list[str]:
        return [data.split(b"\r\n", 1)[0].decode() for _, data in self.sent]


def test_invite_server_retransmits_a_failure_until_ack_then_absorbs() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    invite = request("INVITE")
    tx = InviteServerTransaction(invite, timers, T, wire, reliable=False)
    tx.respond(response(invite, 100))
    tx.on_request(invite)  # a retransmitted INVITE in Proceeding: the 100 again
    assert wire.first_lines() == ["SIP/2.0 100 X", "SIP/2.0 100 X"]
    tx.respond(response(invite, 486))
    assert tx.state == COMPLETED
    timers.advance(3.6)  # Timer G: T1, 2*T1, 4*T1 → resends at 0.5, 1.5, 3.5
    assert wire.times()[2:] == [0.0, 0.5, 1.5, 3.5]
    tx.on_request(invite)  # a retransmitted INVITE in Completed: the 486 again
    assert wire.first_lines()[-1] == "SIP/2.0 486 X"
    tx.on_request(request("ACK"))
    assert tx.state == CONFIRMED
    sent = len(wire.sent)
    timers.advance(4.9)
    assert len(wire.sent) == sent and tx.state == CONFIRMED  # Timer I: T4 over UDP
    tx.on_request(request("ACK"))  # absorbed
    timers.advance(0.2)
    assert tx.state == TERMINATED and timers.pending == 0


def test_invite_server_timer_g_caps_at_t2_and_timer_h_gives_up() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    invite = request("INVITE")
    tx = InviteServerTransaction(invite, timers, T, wire, reliable=False)
    timeouts: list[bool] = []
    tx.on_timeout = lambda: timeouts.append(True)
    tx.respond(response(invite, 503))
    timers.advance(40)
    # 0, then G at 0.5, 1.5, 3.5, 7.5 (T2 = 4 s from here), 11.5, ..., 31.5; H at 32.
    assert wire.times() == [0.0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timeouts == [True] and tx.state == TERMINATED and timers.pending == 0


def test_invite_server_over_tcp_never_retransmits_and_ends_at_ack() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    invite = request("INVITE")
    tx = InviteServerTransaction(invite, timers, T, wire, reliable=True)
    tx.respond(response(invite, 404))
    timers.advance(10)
    assert len(wire.sent) == 1
    tx.on_request(request("ACK"))
    timers.advance(0)
    assert tx.state == TERMINATED


def test_invite_server_accepted_state_absorbs_invites_until_timer_l() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    invite = request("INVITE")
    tx = InviteServerTransaction(invite, timers, T, wire, reliable=False)
    tx.respond(response(invite, 200))
    assert tx.state == ACCEPTED
    tx.on_request(invite)
    assert wire.first_lines() == ["SIP/2.0 200 X", "SIP/2.0 200 X"]
    tx.respond(response(invite, 200))  # the TU's own 2xx retransmission passes
    assert len(wire.sent) == 3
    timers.advance(31.9)
    assert tx.state == ACCEPTED and len(wire.sent) == 3  # no retransmission of its own
    timers.advance(0.2)
    assert tx.state == TERMINATED


def test_non_invite_server_timer_j() -> None:
    for reliable, lifetime in ((False, 32.0), (True, 0.0)):
        timers = ManualTimers()
        wire = Wire(timers)
        bye = request("BYE")
        tx = NonInviteServerTransaction(bye, timers, T, wire, reliable=reliable)
        tx.on_request(bye)  # in Trying: nothing to resend yet
        assert wire.sent == [] and tx.state == TRYING
        tx.respond(response(bye, 200))
        tx.on_request(bye)
        assert wire.first_lines() == ["SIP/2.0 200 X"] * 2 and tx.state == COMPLETED
        timers.advance(lifetime - 0.01 if lifetime else 0)
        assert tx.state == (COMPLETED if lifetime else TERMINATED)
        timers.advance(0.02)
        assert tx.state == TERMINATED


def test_non_invite_client_timer_e_f_k() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    answers: list[int] = []
    timeouts: list[bool] = []
    bye = request("BYE")
    tx = NonInviteClientTransaction(bye, timers, T, wire, False,
                                    lambda r: answers.append(r.status),
                                    lambda: timeouts.append(True))
    tx.start()
    timers.advance(40)
    # E: T1 doubling to T2: 0, 0.5, 1.5, 3.5, 7.5, 11.5, ... 31.5; F at 32.
    assert wire.times() == [0.0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5]
    assert timeouts == [True] and answers == [] and tx.state == TERMINATED

    timers = ManualTimers()
    wire = Wire(timers)
    tx = NonInviteClientTransaction(bye, timers, T, wire, False,
                                    lambda r: answers.append(r.status), lambda: None)
    tx.start()
    timers.advance(0.6)
    tx.receive(response(bye, 100))
    assert tx.state == PROCEEDING
    timers.advance(10)  # in Proceeding: every T2
    assert wire.times() == [0.0, 0.5, 1.5, 5.5, 9.5]
    tx.receive(response(bye, 200))
    tx.receive(response(bye, 200))  # a retransmission: absorbed in Completed
    assert answers == [100, 200] and tx.state == COMPLETED
    timers.advance(4.9)
    assert tx.state == COMPLETED and len(wire.sent) == 5
    timers.advance(0.2)  # Timer K: T4
    assert tx.state == TERMINATED and timers.pending == 0


def test_invite_client_timer_a_b_and_the_ack_of_a_failure() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    timeouts: list[bool] = []
    invite = request("INVITE")
    tx = InviteClientTransaction(invite, timers, T, wire, False, lambda r: None,
                                 lambda: timeouts.append(True))
    tx.start()
    timers.advance(40)
    assert wire.times() == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 31.5]  # A doubles without cap
    assert timeouts == [True]

    timers = ManualTimers()
    wire = Wire(timers)
    answers: list[int] = []
    tx = InviteClientTransaction(invite, timers, T, wire, False,
                                 lambda r: answers.append(r.status), lambda: None)
    tx.start()
    tx.receive(response(invite, 180))
    timers.advance(5)
    assert len(wire.sent) == 1  # provisional: no more retransmissions
    busy = response(invite, 486)
    tx.receive(busy)
    tx.receive(busy)  # retransmitted by the server: the ACK again
    ack_lines = [data for _, data in wire.sent[1:]]
    assert len(ack_lines) == 2 and ack_lines[0] == ack_lines[1]
    ack = parse_message(ack_lines[0])
    assert isinstance(ack, SipRequest) and ack.method == "ACK"
    assert ack.top_via is not None and ack.top_via.branch == "z9hG4bKabc"  # same branch
    assert ack.to_addr.tag == "t" and (ack.cseq.number, ack.cseq.method) == (1, "ACK")
    assert answers == [180, 486] and tx.state == COMPLETED
    timers.advance(32.1)  # Timer D
    assert tx.state == TERMINATED


def test_invite_client_hands_every_2xx_to_the_tu_until_timer_m() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    answers: list[int] = []
    invite = request("INVITE")
    tx = InviteClientTransaction(invite, timers, T, wire, False,
                                 lambda r: answers.append(r.status), lambda: None)
    tx.start()
    tx.receive(response(invite, 200))
    tx.receive(response(invite, 200))
    assert answers == [200, 200] and tx.state == ACCEPTED and len(wire.sent) == 1
    timers.advance(32.1)
    assert tx.state == TERMINATED


def test_the_layer_matches_retransmissions_acks_cancels_and_responses() -> None:
    timers = ManualTimers()
    layer = TransactionLayer(timers, T)
    invite = request("INVITE")
    tx = layer.new_server(invite, Wire(timers), reliable=False)
    assert layer.find_server(request("INVITE")) is tx  # same branch and sent-by
    assert layer.find_server(request("ACK")) is tx  # an ACK matches its INVITE
    assert layer.find_server(request("INVITE", branch="z9hG4bKother")) is None
    cancel = request("CANCEL")
    assert layer.find_server(cancel) is None and layer.find_invite(cancel) is tx
    # An RFC 2543 peer (no magic cookie): matched by dialog and CSeq instead.
    old = request("INVITE", branch="1234")
    old_tx = layer.new_server(old, Wire(timers), reliable=False)
    assert server_key(old)[0] == "2543" and layer.find_server(request("INVITE", "1234")) is old_tx
    answers: list[int] = []
    bye = request("BYE", branch="z9hG4bKbye")
    layer.new_client(bye, Wire(timers), False, lambda r: answers.append(r.status), lambda: None)
    assert layer.receive_response(response(bye, 200))
    assert not layer.receive_response(response(request("BYE", branch="z9hG4bKnone"), 200))
    assert answers == [200]
    tx.respond(response(invite, 603))
    layer.close()
    assert layer.stats() == {"server": 0, "client": 0} and timers.pending == 0


async def test_final_status_passes_over_provisionals_and_reads_a_timeout_as_408() -> None:
    timers = ManualTimers()
    layer = TransactionLayer(timers, T)
    bye = request("BYE", branch="z9hG4bKfinal")
    waiting = asyncio.ensure_future(layer.final_status(bye, Wire(timers), False))
    await asyncio.sleep(0)
    assert layer.receive_response(response(bye, 100))
    await asyncio.sleep(0)
    assert not waiting.done()
    assert layer.receive_response(response(bye, 486))
    assert await waiting == 486
    lost = asyncio.ensure_future(layer.final_status(request("BYE", branch="z9hG4bKlost"),
                                                    Wire(timers), False))
    await asyncio.sleep(0)
    timers.advance(32.1)  # Timer F
    assert await lost == 408
    layer.close()


def test_retransmit_2xx_doubles_to_t2_until_the_ack_then_stops() -> None:
    timers = ManualTimers()
    wire = Wire(timers)
    handles: dict[str, TimerHandle] = {}
    acked = False
    retransmit_2xx(timers, T, wire, b"SIP/2.0 200 OK\r\n\r\n", lambda: not acked, handles)
    timers.advance(15.6)
    assert wire.times() == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5]  # 0.5, 1, 2, 4, then T2
    acked = True
    timers.advance(10.0)
    assert len(wire.sent) == 6 and timers.pending == 0 and "2xx" in handles


def test_retransmit_2xx_stops_when_the_flow_cannot_send() -> None:
    timers = ManualTimers()
    sent: list[bytes] = []

    def broken(data: bytes) -> None:
        sent.append(data)
        raise ConnectionError("gone")

    retransmit_2xx(timers, T, broken, b"x", lambda: True, {})
    timers.advance(60.0)
    assert sent == [b"x"] and timers.pending == 0
