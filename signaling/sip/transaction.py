"""SIP transactions (RFC 3261 §17, with RFC 6026's Accepted states): retransmissions and
timeouts, so the user agent above sees each request once and each answer reliably.

Server transactions absorb retransmitted requests by resending the last response (a
retransmitted INVITE never becomes a second call), retransmit a non-2xx final answer to an
INVITE until its ACK (Timer G, T1 doubling to T2; Timer H gives up after 64*T1), then let
late retransmissions die out (Timers I, J, L). Client transactions retransmit a request over
UDP until it is answered (Timer A for INVITE, doubling; Timer E for others, up to T2), give
up after 64*T1 (Timers B, F), ACK a non-2xx answer to an INVITE themselves, and absorb late
retransmitted answers (Timers D, K, M). Over TCP nothing is retransmitted and the waiting
timers are zero.

Each transaction is a small state machine driven by incoming messages and its own timer
handles (timers.py); it cancels every handle when it ends and then leaves the layer's tables.

Why our own: no SIP library on PyPI is fit (docs/sip.md): one tried here turned a
retransmitted INVITE into a second call and never retransmitted its own INVITE.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import ClassVar

from agent.end_reason import WireEnum
from signaling.sip.message import Headers, SipRequest, SipResponse
from signaling.sip.timers import TimerHandle, Timers, TimerSettings

log = logging.getLogger(__name__)

MAGIC_COOKIE = "z9hG4bK"

Send = Callable[[bytes], None]
ResponseHandler = Callable[[SipResponse], None]
TimeoutHandler = Callable[[], None]


class TxState(WireEnum):
    """A transaction's state, as RFC 3261 §17 (and RFC 6026's Accepted) names it."""

    NEW = "new"  # made, not started yet (a client transaction's start() sends its request)
    CALLING = "calling"
    TRYING = "trying"
    PROCEEDING = "proceeding"
    COMPLETED = "completed"
    CONFIRMED = "confirmed"
    ACCEPTED = "accepted"
    TERMINATED = "terminated"


# The states by their RFC names, as the transaction code below and the user agent use them.
CALLING, TRYING, PROCEEDING = TxState.CALLING, TxState.TRYING, TxState.PROCEEDING
COMPLETED, CONFIRMED, ACCEPTED = TxState.COMPLETED, TxState.CONFIRMED, TxState.ACCEPTED
TERMINATED = TxState.TERMINATED

TIMER_D = 32.0  # §17.1.1.2: at least 32 s over UDP, for the server's retransmissions to die out
ServerKey = tuple[str, ...]
ClientKey = tuple[str, str]


def server_key(request: SipRequest) -> ServerKey:
    """RFC 3261 §17.2.3: branch, sent-by and method (an ACK matches its INVITE). A request
    from an RFC 2543 element (no magic cookie) is keyed on its dialog and CSeq instead."""
    method = "INVITE" if request.method == "ACK" else request.method
    via = request.top_via
    branch = via.branch if via is not None else None
    if via is not None and branch and branch.startswith(MAGIC_COOKIE):
        host, port = via.sent_by
        return ("3261", branch, host, str(port), method)
    return ("2543", request.uri, request.from_addr.tag or "", request.call_id,
            str(request.cseq.number), str(via) if via is not None else "", method)


def client_key(branch: str, method: str) -> ClientKey:
    return branch, ("INVITE" if method == "ACK" else method)


class Transaction:
    """What server and client transactions share: state, timers, the way to send."""

    kind: ClassVar[str] = "transaction"

    def __init__(self, timers: Timers, settings: TimerSettings, send: Send,
                 reliable: bool) -> None:
        self.timers = timers
        self.settings = settings
        self.send = send
        self.reliable = reliable
        self.state = TxState.NEW
        self.on_terminated: Callable[[Transaction], None] | None = None
        self._handles: dict[str, TimerHandle] = {}

    @property
    def terminated(self) -> bool:
        return self.state == TERMINATED

    def _start_timer(self, name: str, delay: float, callback: Callable[[], None]) -> None:
        self._stop_timer(name)

        def fire() -> None:
            self._handles.pop(name, None)
            if not self.terminated:
                callback()

        self._handles[name] = self.timers.call_later(delay, fire)

    def _stop_timer(self, name: str) -> None:
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _transmit(self, data: bytes) -> None:
        try:
            self.send(data)
        except (OSError, RuntimeError) as exc:  # a transport error: a timeout (§17.1.4)
            log.info("%s: send failed: %r", self.kind, exc)
            self._transport_error()

    def _transport_error(self) -> None:
        self.terminate()

    def terminate(self) -> None:
        """End now: every timer cancelled, the layer told (idempotent)."""
        if self.terminated:
            return
        self.state = TERMINATED
        for handle in self._handles.values():
            handle.cancel()
        self._handles.clear()
        # The layer's hook closes over this transaction: dropped here, so an ended
        # transaction is freed at once by reference counting, not left as a cycle for a
        # full garbage collection that an idle server may not run for a long time.
        told, self.on_terminated = self.on_terminated, None
        if told is not None:
            told(self)


# -- server transactions -----------------------------------------------------------------------


class ServerTransaction(Transaction):
    def __init__(self, request: SipRequest, timers: Timers, settings: TimerSettings,
                 send: Send, reliable: bool) -> None:
        super().__init__(timers, settings, send, reliable)
        self.request = request
        self.last_response: SipResponse | None = None
        self._last_bytes: bytes | None = None
        self.retransmissions_absorbed = 0
        # Told when the transaction gives up on its peer (Timer H: no ACK for a non-2xx).
        self.on_timeout: TimeoutHandler | None = None

    @property
    def final_sent(self) -> bool:
        return self.last_response is not None and self.last_response.status >= 200

    def respond(self, response: SipResponse) -> None:
        raise NotImplementedError

    def terminate(self) -> None:
        super().terminate()
        self.on_timeout = None  # the user agent's hook may hold its call: no cycle left

    def on_request(self, request: SipRequest) -> None:
        """A retransmission of the request (or, for INVITE, its ACK)."""
        raise NotImplementedError

    def _send_response(self, response: SipResponse) -> None:
        self.last_response = response
        self._last_bytes = response.to_bytes()
        self._transmit(self._last_bytes)

    def _resend_last(self) -> None:
        self.retransmissions_absorbed += 1
        if self._last_bytes is not None:
            self._transmit(self._last_bytes)


class InviteServerTransaction(ServerTransaction):
    """RFC 3261 §17.2.1 (figure 7), with RFC 6026's Accepted state after a 2xx: the TU then
    retransmits the 2xx itself (§13.3.1.4) and the transaction absorbs INVITE copies."""

    kind = "invite-server"

    def __init__(self, request: SipRequest, timers: Timers, settings: TimerSettings,
                 send: Send, reliable: bool) -> None:
        super().__init__(request, timers, settings, send, reliable)
        self.state = PROCEEDING
        self._g_interval = settings.t1

    def respond(self, response: SipResponse) -> None:
        if self.state != PROCEEDING:
            if self.state == ACCEPTED and 200 <= response.status < 300:
                self._send_response(response)  # the TU's own 2xx retransmission
            return
        if response.status < 200:
            self._send_response(response)
            return
        if response.status < 300:
            self.state = ACCEPTED
            self._send_response(response)
            self._start_timer("L", self.settings.timeout, self.terminate)
            return
        self.state = COMPLETED
        self._send_response(response)
        if not self.reliable:
            self._start_timer("G", self._g_interval, self._timer_g)
        self._start_timer("H", self.settings.timeout, self._timer_h)

    def on_request(self, request: SipRequest) -> None:
        if request.method == "ACK":
            if self.state == COMPLETED:
                self.state = CONFIRMED
                self._stop_timer("G")
                self._stop_timer("H")
                self._start_timer("I", 0.0 if self.reliable else self.settings.t4,
                                  self.terminate)
            return  # an ACK in any other state is absorbed
        if self.state in (PROCEEDING, COMPLETED, ACCEPTED):
            self._resend_last()
        else:
            self.retransmissions_absorbed += 1

    def _timer_g(self) -> None:
        if self.state != COMPLETED:
            return
        self._resend_last()
        self._g_interval = min(2 * self._g_interval, self.settings.t2)
        self._start_timer("G", self._g_interval, self._timer_g)

    def _timer_h(self) -> None:
        log.info("invite-server: no ACK for %s within %g s (Timer H)",
                 self.last_response.status if self.last_response else "?",
                 self.settings.timeout)
        handler = self.on_timeout
        self.terminate()
        if handler is not None:
            handler()


class NonInviteServerTransaction(ServerTransaction):
    """RFC 3261 §17.2.2 (figure 8)."""

    kind = "non-invite-server"

    def __init__(self, request: SipRequest, timers: Timers, settings: TimerSettings,
                 send: Send, reliable: bool) -> None:
        super().__init__(request, timers, settings, send, reliable)
        self.state = TRYING

    def respond(self, response: SipResponse) -> None:
        if self.state not in (TRYING, PROCEEDING):
            return
        self._send_response(response)
        if response.status < 200:
            self.state = PROCEEDING
            return
        self.state = COMPLETED
        self._start_timer("J", 0.0 if self.reliable else self.settings.timeout, self.terminate)

    def on_request(self, request: SipRequest) -> None:
        if self.state in (PROCEEDING, COMPLETED):
            self._resend_last()
        else:
            self.retransmissions_absorbed += 1


# -- client transactions -----------------------------------------------------------------------


class ClientTransaction(Transaction):
    def __init__(self, request: SipRequest, timers: Timers, settings: TimerSettings,
                 send: Send, reliable: bool, on_response: ResponseHandler,
                 on_timeout: TimeoutHandler) -> None:
        super().__init__(timers, settings, send, reliable)
        self.request = request
        self.branch = (request.top_via.branch if request.top_via else None) or ""
        self.on_response = on_response
        self.on_timeout = on_timeout
        self.transmissions = 0
        self._request_bytes = request.to_bytes()

    def start(self) -> None:
        raise NotImplementedError

    def receive(self, response: SipResponse) -> None:
        raise NotImplementedError

    def _send_request(self) -> None:
        self.transmissions += 1
        self._transmit(self._request_bytes)

    def _give_up(self) -> None:
        handler = self.on_timeout
        self.terminate()
        handler()

    def _transport_error(self) -> None:
        if not self.terminated:
            self._give_up()


class NonInviteClientTransaction(ClientTransaction):
    """RFC 3261 §17.1.2 (figure 6): Timer E retransmits (UDP), F gives up, K absorbs."""

    kind = "non-invite-client"

    def start(self) -> None:
        self.state = TRYING
        self._e_interval = self.settings.t1
        self._send_request()
        if self.terminated:
            return
        if not self.reliable:
            self._start_timer("E", self._e_interval, self._timer_e)
        self._start_timer("F", self.settings.timeout, self._give_up)

    def _timer_e(self) -> None:
        if self.state not in (TRYING, PROCEEDING):
            return
        self._send_request()
        if self.state == TRYING:
            self._e_interval = min(2 * self._e_interval, self.settings.t2)
        else:
            self._e_interval = self.settings.t2
        self._start_timer("E", self._e_interval, self._timer_e)

    def receive(self, response: SipResponse) -> None:
        if self.state not in (TRYING, PROCEEDING):
            return  # a retransmitted final answer: absorbed in Completed
        if response.status < 200:
            self.state = PROCEEDING
            self.on_response(response)
            return
        self.state = COMPLETED
        self._stop_timer("E")
        self._stop_timer("F")
        self._start_timer("K", 0.0 if self.reliable else self.settings.t4, self.terminate)
        self.on_response(response)


class InviteClientTransaction(ClientTransaction):
    """RFC 3261 §17.1.1 (figure 5) with RFC 6026's Accepted state: Timer A retransmits (UDP,
    doubling), B gives up, a non-2xx is ACKed here and D absorbs its retransmissions; 2xx
    answers all go to the TU (which ACKs them) until Timer M."""

    kind = "invite-client"

    def start(self) -> None:
        self.state = CALLING
        self._a_interval = self.settings.t1
        self._ack_bytes: bytes | None = None
        self._send_request()
        if self.terminated:
            return
        if not self.reliable:
            self._start_timer("A", self._a_interval, self._timer_a)
        self._start_timer("B", self.settings.timeout, self._give_up)

    def _timer_a(self) -> None:
        if self.state != CALLING:
            return
        self._send_request()
        self._a_interval *= 2
        self._start_timer("A", self._a_interval, self._timer_a)

    def receive(self, response: SipResponse) -> None:
        if self.state in (CALLING, PROCEEDING):
            self._stop_timer("A")
            self._stop_timer("B")
            if response.status < 200:
                self.state = PROCEEDING
            elif response.status < 300:
                self.state = ACCEPTED
                self._start_timer("M", self.settings.timeout, self.terminate)
            else:
                self.state = COMPLETED
                self._ack_bytes = ack_for_non_2xx(self.request, response).to_bytes()
                self._transmit(self._ack_bytes)
                self._start_timer("D", 0.0 if self.reliable else TIMER_D,
                                  self.terminate)
            self.on_response(response)
        elif self.state == ACCEPTED and 200 <= response.status < 300:
            self.on_response(response)  # a retransmitted 2xx: the TU ACKs it again
        elif self.state == COMPLETED and response.status >= 300 and self._ack_bytes:
            self._transmit(self._ack_bytes)


def retransmit_2xx(timers: Timers, settings: TimerSettings, send: Send, data: bytes,
                   pending: Callable[[], bool], handles: dict[str, TimerHandle]) -> None:
    """Send an INVITE's 2xx (`data`, already sent once) again over an unreliable flow, T1
    doubling to T2, while `pending()` says its ACK has not come (RFC 3261 §13.3.1.4: the
    core, not the transaction, does this). The next resend's handle is kept in
    `handles["2xx"]` for its owner to cancel; a send that fails ends the resending."""
    interval = settings.t1

    def again() -> None:
        nonlocal interval
        if not pending():
            return
        try:
            send(data)
        except (OSError, ConnectionError):
            return
        interval = min(2 * interval, settings.t2)
        handles["2xx"] = timers.call_later(interval, again)

    handles["2xx"] = timers.call_later(interval, again)


def ack_for_non_2xx(invite: SipRequest, response: SipResponse) -> SipRequest:
    """RFC 3261 §17.1.1.3: the ACK a client transaction sends for a 300-699 answer."""
    headers = Headers()
    vias = invite.headers.get_all("via")
    if vias:
        headers.add("Via", vias[0])
    for route in invite.headers.lines("route"):
        headers.add("Route", route)
    headers.add("Max-Forwards", "70")
    headers.add("From", invite.headers.get("from") or "")
    headers.add("To", response.headers.get("to") or "")
    headers.add("Call-ID", invite.call_id)
    headers.add("CSeq", f"{invite.cseq.number} ACK")
    return SipRequest(headers=headers, method="ACK", uri=invite.uri)


# -- the layer ---------------------------------------------------------------------------------


class TransactionLayer:
    """Every live transaction, found by the keys RFC 3261 §17.1.3 and §17.2.3 define."""

    def __init__(self, timers: Timers, settings: TimerSettings | None = None) -> None:
        self.timers = timers
        self.settings = settings or TimerSettings()
        self.servers: dict[ServerKey, ServerTransaction] = {}
        self.clients: dict[ClientKey, ClientTransaction] = {}

    def find_server(self, request: SipRequest) -> ServerTransaction | None:
        return self.servers.get(server_key(request))

    def find_invite(self, cancel: SipRequest) -> InviteServerTransaction | None:
        """The INVITE transaction a CANCEL is for (same key, method INVITE; §9.2)."""
        key = server_key(cancel)
        transaction = self.servers.get(key[:-1] + ("INVITE",))
        return transaction if isinstance(transaction, InviteServerTransaction) else None

    def new_server(self, request: SipRequest, send: Send, reliable: bool) -> ServerTransaction:
        cls: type[ServerTransaction] = (InviteServerTransaction if request.method == "INVITE"
                                        else NonInviteServerTransaction)
        transaction = cls(request, self.timers, self.settings, send, reliable)
        key = server_key(request)
        self.servers[key] = transaction

        def forget(_: Transaction) -> None:
            if self.servers.get(key) is transaction:
                del self.servers[key]

        transaction.on_terminated = forget
        return transaction

    def new_client(self, request: SipRequest, send: Send, reliable: bool,
                   on_response: ResponseHandler, on_timeout: TimeoutHandler) -> ClientTransaction:
        """Create and start a client transaction for `request` (its top Via carries a fresh
        branch)."""
        cls: type[ClientTransaction] = (InviteClientTransaction if request.method == "INVITE"
                                        else NonInviteClientTransaction)
        transaction = cls(request, self.timers, self.settings, send, reliable, on_response,
                          on_timeout)
        key = client_key(transaction.branch, request.method)
        self.clients[key] = transaction

        def forget(_: Transaction) -> None:
            if self.clients.get(key) is transaction:
                del self.clients[key]

        transaction.on_terminated = forget
        transaction.start()
        return transaction

    async def final_status(self, request: SipRequest, send: Send, reliable: bool) -> int:
        """Send `request` in a new client transaction and wait for its final status:
        provisional answers are passed over, and a transaction that times out reads 408."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_response(response: SipResponse) -> None:
            if response.status >= 200 and not done.done():
                done.set_result(response.status)

        def on_timeout() -> None:
            if not done.done():
                done.set_result(408)

        self.new_client(request, send, reliable, on_response, on_timeout)
        return await done

    def receive_response(self, response: SipResponse) -> bool:
        """Hand a response to its client transaction; False when none matches (stray)."""
        via = response.top_via
        if via is None or not via.branch:
            return False
        transaction = self.clients.get(client_key(via.branch, response.cseq.method))
        if transaction is None:
            return False
        transaction.receive(response)
        return True

    def close(self) -> None:
        for transaction in [*self.servers.values(), *self.clients.values()]:
            transaction.on_terminated = None
            transaction.terminate()
        self.servers.clear()
        self.clients.clear()

    def stats(self) -> dict[str, int]:
        return {"server": len(self.servers), "client": len(self.clients)}
