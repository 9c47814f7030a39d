"""Dialog hooks (signaling/sip/hooks.py): the newest hook of a dialog is asked first, a hook
that declines passes the request on, removed hooks are gone, and ACK hooks (one a dialog)
take the ACKs they recognise."""

from __future__ import annotations

from signaling.sip.hooks import DialogHooks
from signaling.sip.message import Headers, SipRequest
from signaling.sip.transaction import ServerTransaction

DIALOG = ("call-1@test", "ours", "theirs")
OTHER = ("call-2@test", "ours", "theirs")


def request(method: str, cseq: int = 1) -> SipRequest:
    headers = Headers()
    headers.add("Via", "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKhooks")
    headers.add("From", "<sip:a@127.0.0.1>;tag=theirs")
    headers.add("To", "<sip:b@127.0.0.1>;tag=ours")
    headers.add("Call-ID", DIALOG[0])
    headers.add("CSeq", f"{cseq} {method}")
    return SipRequest(headers=headers, method=method, uri="sip:b@127.0.0.1")


TX = ServerTransaction.__new__(ServerTransaction)  # never used by the hooks under test


def test_newest_hook_first_and_declines_pass_on() -> None:
    hooks, seen = DialogHooks(), []

    def older(req: SipRequest, tx: ServerTransaction) -> bool:
        seen.append(("older", req.method))
        return True

    def newer(req: SipRequest, tx: ServerTransaction) -> bool:
        seen.append(("newer", req.method))
        return req.method == "NOTIFY"

    hooks.add(DIALOG, older)
    hooks.add(DIALOG, newer)
    assert hooks.handle(DIALOG, request("NOTIFY"), TX)
    assert hooks.handle(DIALOG, request("BYE"), TX)
    assert seen == [("newer", "NOTIFY"), ("newer", "BYE"), ("older", "BYE")]
    assert not hooks.handle(OTHER, request("BYE"), TX)
    hooks.remove(DIALOG, newer)
    hooks.remove(DIALOG, older)
    hooks.remove(DIALOG, older)  # twice: no error
    assert len(hooks) == 0 and not hooks.handle(DIALOG, request("BYE"), TX)


def test_ack_hooks_take_what_they_recognise_and_count_until_removed() -> None:
    hooks, acks = DialogHooks(), []

    def on_ack(ack: SipRequest) -> bool:
        acks.append(ack.cseq.number)
        return ack.cseq.number == 2

    assert not hooks.ack(DIALOG, request("ACK", 2))  # none set
    hooks.set_ack(DIALOG, on_ack)
    assert len(hooks) == 1
    assert not hooks.ack(DIALOG, request("ACK", 1))  # not the one it waits for: stray
    assert hooks.ack(DIALOG, request("ACK", 2))
    assert not hooks.ack(OTHER, request("ACK", 2))
    hooks.set_ack(DIALOG, None)
    assert len(hooks) == 0 and not hooks.ack(DIALOG, request("ACK", 2))
    assert acks == [1, 2]
