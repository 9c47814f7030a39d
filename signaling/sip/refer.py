"""Call transfer (RFC 3515): the agent asks the far end of an established SIP call to call
someone else, and steps out when that succeeded.

`Transfers.refer` sends REFER in the call's dialog (Refer-To the target, Referred-By the
agent's own party) on a non-INVITE client transaction and waits for its final answer. A 2xx
(202 Accepted) opens the implicit subscription: the far end reports the new call's progress
in NOTIFYs (`Event: refer`, a `message/sipfrag` body such as `SIP/2.0 180 Ringing`), each
answered 200. A 2xx sipfrag ends the agent's side: the leg closes with reason
`transferred`, which sends the BYE (ua.py for inbound calls, outbound.py for outbound ones).
A failure (REFER refused or unanswered, a sipfrag of 300-699, the subscription terminated
without a final status, no final NOTIFY within 64*T1) keeps the call and is reported as a
`call.transfer.failed` event on the leg. Every step is an event on the leg
(`call.transfer.accepted`, `call.transfer.progress`, `call.transfer.completed`).
A NOTIFY reaches this only from the call's own peer or proxy: the user agent refuses any
request of the dialog from another transport address first (dialog_guard.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from agent.end_reason import EndReason
from agent.errors import AgentError
from agent.leg import Leg
from agent.logs.log_safe import printable
from agent.task_owner import TaskOwner
from signaling.sip.dialog import Dialog, DialogId
from signaling.sip.message import SipRequest
from signaling.sip.timers import TimerHandle
from signaling.sip.transaction import ServerTransaction
from signaling.sip.transport import Flow
from signaling.sip.ua import UserAgent
from signaling.sip.uri import Uri, parse_name_addr, parse_uri

log = logging.getLogger(__name__)

MAX_TARGET_CHARS = 512
SIPFRAG_STATUS = re.compile(r"SIP/2\.0 ([1-6][0-9][0-9])(?: |$)")
TEL_NUMBER = re.compile(r"\+?[0-9][0-9*#.()\-]*(;[A-Za-z0-9\-]+(=[A-Za-z0-9\-.+%]+)?)*\Z")


class TransferError(AgentError):
    """A transfer that could not be asked for (bad target, not a SIP call, one running)."""


def parse_target(value: object) -> Uri:
    """A `target_uri`: a sip:, sips: or tel: URI on one line; TransferError 400 otherwise."""
    if not isinstance(value, str) or not value or len(value) > MAX_TARGET_CHARS:
        raise TransferError("invalid_target", f"'target_uri' must be a sip:, sips: or tel: "
                            f"URI of at most {MAX_TARGET_CHARS} characters",
                            param="target_uri")
    uri = parse_uri(value)
    valid = uri is not None and (
        (uri.is_sip and bool(uri.host)) or (uri.scheme == "tel" and TEL_NUMBER.match(uri.opaque)))
    if uri is None or not valid:
        raise TransferError("invalid_target", "'target_uri' must be a sip:, sips: or tel: URI, "
                            "e.g. tel:+14155550123 or sip:desk@pbx.example.com",
                            param="target_uri")
    return uri


def sipfrag_status(body: bytes) -> int | None:
    """The status line of a message/sipfrag body (`SIP/2.0 200 OK`), else None."""
    first = body.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
    match = SIPFRAG_STATUS.match(first)
    return int(match.group(1)) if match else None


@dataclass
class Transfer:
    api_id: str  # the call's id in the HTTP API (its SIP Call-ID is `dialog.call_id`)
    dialog: Dialog
    flow: Flow
    leg: Leg
    target: Uri
    state: str = "referring"  # referring, accepted, completed, failed
    sip_status: int | None = None  # of the REFER, then of the last sipfrag
    timer: TimerHandle | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    def note(self, kind: str, **data: Any) -> None:
        event = {"type": kind, "target_uri": str(self.target), **data}
        self.events.append(event)
        if not self.leg.closing:
            self.leg.emit(event)


class Transfers:
    """The transfers running on one user agent, one per dialog at most."""

    def __init__(self, ua: UserAgent) -> None:
        self.ua = ua
        self.running: dict[DialogId, Transfer] = {}
        self.tasks = TaskOwner("sip-transfers")
        self.counters: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    async def refer(self, api_id: str, dialog: Dialog, flow: Flow, leg: Leg,
                    target: Uri) -> Transfer:
        """Send the REFER and wait for its answer. Returns the accepted transfer; raises
        TransferError 409 (one is running), 502 (refused) or 504 (unanswered)."""
        if dialog.id in self.running:
            raise TransferError("transfer_in_progress", "a transfer of this call is already "
                                "under way", status=409)
        ua = self.ua
        transport = flow.transport
        request, hop = dialog.request("REFER", ua.config.advertised_host, ua.port, transport,
                                      contact=ua._contact(transport))
        request.headers.add("Refer-To", f"<{target}>")
        local = parse_name_addr(dialog.local_party)
        request.headers.add("Referred-By",
                            f"<{local.uri}>" if local else ua._contact(transport))
        transfer = Transfer(api_id, dialog, flow, leg, target)
        self.running[dialog.id] = transfer
        ua.dialog_hooks.add(dialog.id, self._hook)
        self._count("referred")
        try:
            next_flow = await ua.flow_for(flow, hop, dialog.call_id)
            if next_flow is None:
                raise TransferError("refer_unreachable", "the call's far end cannot be "
                                    "reached", status=502)
            status = await self._send(request, next_flow)
        except BaseException:
            self._finish(transfer)
            raise
        transfer.sip_status = status
        if status == 408:
            self._fail(transfer, "refer_timeout", "the far end did not answer the REFER")
            raise TransferError("refer_timeout", "the far end did not answer the REFER",
                                status=504)
        if not 200 <= status < 300:
            self._fail(transfer, "refer_rejected", f"the far end refused the REFER ({status})")
            raise TransferError("refer_rejected", f"the far end refused the transfer with SIP "
                                f"{status}; the call goes on", status=502)
        if transfer.state == "referring":  # a NOTIFY may have settled it already
            transfer.state = "accepted"
            transfer.note("call.transfer.accepted", sip_status=status)
            transfer.timer = ua.timers.call_later(
                ua.config.timers.timeout,
                lambda: self._fail(transfer, "transfer_timeout",
                                   "no final NOTIFY came for the transfer"))
        log.info("sip: call %s REFER to %s answered %d", api_id, printable(str(target)),
                 status)
        return transfer

    async def _send(self, request: SipRequest, flow: Flow) -> int:
        return await self.ua.transactions.final_status(request, flow.send, flow.reliable)

    def _hook(self, request: SipRequest, tx: ServerTransaction) -> bool:
        """A NOTIFY of the refer subscription (others go on to the call's own handling)."""
        if request.method != "NOTIFY":
            return False
        event = (request.headers.get("event") or "").split(";", 1)[0].strip().lower()
        transfer = self.running.get((request.call_id, request.to_addr.tag or "",
                                     request.from_addr.tag or ""))
        if event != "refer" or transfer is None:
            return False
        dialog = transfer.dialog
        if request.cseq.number < dialog.remote_seq:
            tx.respond(self.ua._response(request, 500, reason="CSeq Out of Order"))
            return True
        dialog.remote_seq = request.cseq.number
        status = sipfrag_status(request.body)
        if status is None:
            tx.respond(self.ua._response(request, 400, reason="Bad sipfrag"))
            return True
        tx.respond(self.ua._response(request, 200))
        terminated = (request.headers.get("subscription-state") or "").lower().startswith(
            "terminated")
        transfer.sip_status = status
        if status < 200:
            transfer.note("call.transfer.progress", sip_status=status)
            if terminated:
                self._fail(transfer, "transfer_failed", "the subscription ended before the "
                           "transfer did")
        elif status < 300:
            self._complete(transfer)
        else:
            self._fail(transfer, "transfer_failed", f"the transfer target answered {status}")
        return True

    def _complete(self, transfer: Transfer) -> None:
        if transfer.state in ("completed", "failed"):
            return
        transfer.state = "completed"
        self._count("completed")
        transfer.note("call.transfer.completed", sip_status=transfer.sip_status)
        log.info("sip: call %s transferred to %s", transfer.api_id,
                 printable(str(transfer.target)))
        self._finish(transfer)
        self.tasks.spawn(transfer.leg.close(EndReason.TRANSFERRED), "transferred")

    def _fail(self, transfer: Transfer, code: str, message: str) -> None:
        if transfer.state in ("completed", "failed"):
            return
        transfer.state = "failed"
        self._count(code)
        transfer.note("call.transfer.failed", code=code, message=message,
                      sip_status=transfer.sip_status)
        log.info("sip: call %s transfer failed: %s", transfer.api_id, message)
        self._finish(transfer)

    def _finish(self, transfer: Transfer) -> None:
        if transfer.timer is not None:
            transfer.timer.cancel()
            transfer.timer = None
        if self.running.get(transfer.dialog.id) is transfer:
            del self.running[transfer.dialog.id]
            self.ua.dialog_hooks.remove(transfer.dialog.id, self._hook)

    async def close(self) -> None:
        for transfer in list(self.running.values()):
            self._finish(transfer)
        cancelled = self.tasks.cancel_all()
        if cancelled:
            await asyncio.gather(*cancelled, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {"running": len(self.running), "counters": dict(self.counters)}
