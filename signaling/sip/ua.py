"""The SIP user agent: inbound calls answered by the media agent (RFC 3261 UAS core).

Every message from the transports is parsed (message.py); a request from outside
`--sip-allow` gets 403, a malformed one 400/413/416/505 where it can be addressed (else it is
dropped), a retransmission is absorbed by its transaction (transaction.py). Then, by method:

- INVITE (new): 100 Trying at once; 503 while the plugin is not up, the server drains or is
  full; 415/488 for an offer the agent cannot serve (no codec it speaks, a media address
  outside `--rtp-allow`, RTP/SAVP without a usable key: sdes.py); no SDP at all is a late
  offer (update.py: our offer in the 200, the answer in the ACK); otherwise 180 Ringing
  (ringing on, at start-up, until every worker serves: serving.py), an RTP leg opened
  through the media agent's admission (media.py), and 200 OK with the SDP
  answer, retransmitted (T1 doubling to T2) until the ACK. No ACK within 64*T1: the call is
  ended with a BYE. With `--sip-webhook`, between the 180 and the leg:
  `realtime.call.incoming` posted (a task of the call's), and the call rings until the
  application's accept (api.py: the leg opens with its session) or reject (that status), or
  480 after `--sip-accept-timeout`.
- CANCEL before the answer: 200, then 487 to the INVITE, and the pending call is freed.
- re-INVITE: hold/resume and a moved remote (200 with the mirrored direction), 488 for an
  unusable offer (the call goes on), 491 while an offer/answer is still open.
- UPDATE (RFC 3311): an offer answered in its 200 like a re-INVITE's; without SDP a target
  refresh. With `--sip-auth-file`, out-of-dialog requests are challenged first
  (caller_auth.py).
- BYE: 200 and the leg ends. The agent's own BYE (the leg ended: HTTP hang-up, media timeout,
  drain, shutdown) goes to the remote target through the route set, on a client transaction.
- OPTIONS: 200 with Allow/Accept, 503 while draining, full or not ready (probes).
- Any request in a live dialog, inbound or outbound (the CANCEL of a ringing call too), from
  a transport address that is not the dialog's: 403, an ACK dropped, the call untouched
  (dialog_guard.py). The top Via's `received` (and `rport`) always get the real source.
- ACK, and 481 for BYE/CANCEL/re-INVITE of an unknown dialog; 405 for methods the agent
  knows but does not serve, 501 for the rest; 420 for a Require it does not support.

Nothing a peer sends raises out of here: an unexpected error is logged, counted, and the
request answered 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import secrets
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import aiohttp
from standardwebhooks import Webhook

from agent.end_reason import Ending, EndReason, WireEnum
from agent.errors import AgentError, CallError
from agent.logs.log_safe import LogThrottle, held_back_note, printable
from agent.media_agent import MediaAgent
from agent.plugins.base import SessionConfig
from agent.task_owner import TaskOwner
from agent.telephony.address_policy import refusal_for
from agent.telephony.rtp_leg import RtpSettings
from agent.worker_tag import ID_TOKEN_BYTES, tagged_token
from signaling.auth import Principal
from signaling.call_webhook import new_message_id, signed_headers
from signaling.sip import sdes
from signaling.sip import tls as sip_tls
from signaling.sip.budget import CAP_RETRY_AFTER, MessageBudget, TransactionCap
from signaling.sip.caller_auth import CallerAuth
from signaling.sip.config import WILDCARDS, SipConfig
from signaling.sip.dialog import Dialog, DialogId, new_tag
from signaling.sip.dialog_guard import DialogSources, dialog_sources, source_allowed
from signaling.sip.guard import InviteLimiter, Verdict
from signaling.sip.hooks import DialogHooks
from signaling.sip.media import SIP_OWNER, SipRtpLeg, open_sip_leg
from signaling.sip.message import (
    REASONS,
    Headers,
    ParseFailure,
    SipRequest,
    SipResponse,
    parse_message,
    parse_via,
)
from signaling.sip.sdp import (
    SIP_CODECS,
    AudioChoice,
    SdpError,
    SessionDescription,
    build_answer,
    choose_audio,
    parse_sdp,
)
from signaling.sip.timers import LoopTimers, TimerHandle, Timers
from signaling.sip.transaction import (
    COMPLETED,
    InviteServerTransaction,
    Send,
    ServerKey,
    ServerTransaction,
    TransactionLayer,
    retransmit_2xx,
    server_key,
)
from signaling.sip.transaction import (
    CONFIRMED as TX_CONFIRMED,
)
from signaling.sip.transport import Flow, SipTransports
from signaling.sip.update import own_offer, take_answer
from signaling.sip.uri import Uri

log = logging.getLogger(__name__)

ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE"
KNOWN_UNSUPPORTED = frozenset({"REGISTER", "SUBSCRIBE", "NOTIFY", "REFER", "MESSAGE", "INFO",
                               "PRACK", "PUBLISH"})
SERVER_NAME = "duplex-agent"
RETRY_AFTER_SECONDS = 5
STOP_GRACE_SECONDS = 2.0
# How long an INVITE may ring while the other workers start (they take seconds, not more).
ADMITTING_WAIT_S = 30.0
SETUP_SAMPLES = 1000

# What the application answered to realtime.call.incoming: accept (a session, the owner of
# the call) or reject (a status code).
Decision = tuple[SessionConfig, Principal] | int


class InboundState(WireEnum):
    """An inbound call's protocol step (outbound_api.INBOUND_STATES says what GET shows).
    The agent answers here: AWAITING_ACK is its 2xx sent, not yet acknowledged."""

    EARLY = "early"  # INVITE received, not answered yet
    AWAITING_ACK = "awaiting_ack"  # a 2xx sent (INVITE or re-INVITE), waiting for its ACK
    CONFIRMED = "confirmed"  # the ACK came (RFC 3261's confirmed dialog)
    ENDING = "ending"  # our BYE is on its way
    ENDED = "ended"


@dataclass
class SipCall:
    """One inbound call: its dialog, the INVITE being answered, the media leg."""

    invite: SipRequest
    invite_tx: InviteServerTransaction
    flow: Flow
    dialog: Dialog
    offer: SessionDescription
    choice: AudioChoice
    state: InboundState = InboundState.EARLY
    leg: SipRtpLeg | None = None
    received_at: float = field(default_factory=time.monotonic)
    sdp_session: int = field(default_factory=lambda: int(time.time()))
    sdp_version: int = 1
    local_sdp: bytes = b""
    ack_cseq: int = 0  # the CSeq an ACK must carry for the 2xx being retransmitted
    bye_reason: Ending | None = None  # the leg ended before the ACK: BYE once it comes
    tasks: TaskOwner = field(default_factory=lambda: TaskOwner("sip-call"))
    timers: dict[str, TimerHandle] = field(default_factory=dict)
    # The id of the call in the HTTP API (/v1/realtime/calls/{id}), its leg's id once open;
    # `dialog.call_id` is SIP's Call-ID, `dialog_id` the dialog's key.
    api_id: str = field(default_factory=lambda: f"sip_{tagged_token(ID_TOKEN_BYTES)}")
    decision: asyncio.Future[Decision] | None = None  # waiting for accept/reject (webhook)
    outcome: asyncio.Future[AgentError | None] | None = None  # what an accept came to
    srtp: sdes.SdesAnswer | None = None  # SDES-SRTP keys and our a=crypto (sdes.py)
    awaiting_answer: bool = False  # our offer went in a 2xx: the answer comes in the ACK

    @property
    def pending(self) -> bool:
        """Waiting for the application's accept or reject."""
        return (self.state == InboundState.EARLY and self.decision is not None
                and not self.decision.done())

    @property
    def dialog_id(self) -> DialogId:
        return self.dialog.id

    def stop_timers(self) -> None:
        for handle in self.timers.values():
            handle.cancel()
        self.timers.clear()


def dialog_id_of(request: SipRequest) -> DialogId:
    """The dialog an incoming request is in: (Call-ID, its To tag = ours, its From tag)."""
    return request.call_id, request.to_addr.tag or "", request.from_addr.tag or ""


class UserAgent:
    def __init__(self, agent: MediaAgent, config: SipConfig, rtp: RtpSettings,
                 timers: Timers | None = None) -> None:
        self.agent = agent
        self.config = config
        self.rtp = rtp
        self.timers = timers or LoopTimers()
        self.transactions = TransactionLayer(self.timers, config.timers)
        self.transports = SipTransports(self._on_message, self._on_failure, self._allowed,
                                        config.max_message_bytes,
                                        tcp_per_address=config.budget.tcp_per_address,
                                        header_timeout=config.budget.header_timeout)
        self.calls: dict[DialogId, SipCall] = {}
        self._by_invite: dict[ServerKey, SipCall] = {}
        self._by_remote: dict[tuple[str, str], SipCall] = {}  # (Call-ID, From tag)
        self._by_leg: dict[str, SipCall] = {}
        self._by_api_id: dict[str, SipCall] = {}
        self._http: aiohttp.ClientSession | None = None  # the webhook's
        if config.webhook_url and not config.webhook_secret:
            raise ValueError("a SIP webhook needs a signing secret (whsec_...)")
        self._webhook = Webhook(config.webhook_secret) if config.webhook_secret else None
        self.tasks = TaskOwner("sip-ua")
        # Set once the whole server serves (worker 0 of several: serving.py); an INVITE
        # that comes before rings until then (at most ADMITTING_WAIT_S).
        self.admitting: asyncio.Event | None = None
        self.counters: Counter[str] = Counter()
        self.setup_ms: deque[float] = deque(maxlen=SETUP_SAMPLES)  # INVITE → 200 OK
        self._noise = LogThrottle(1.0)
        self.guard = InviteLimiter(config.guard)  # INVITE flood limit (guard.py)
        self.budget = MessageBudget(config.budget)  # every message, per source (budget.py)
        self.transaction_cap = TransactionCap(config.budget)  # --sip-max-transactions
        # Dialogs served outside this core: outbound calls, a transfer's NOTIFYs (hooks.py).
        self.dialog_hooks = DialogHooks()
        # Where the requests of those dialogs may come from (dialog_guard.py).
        self.dialog_sources = DialogSources()
        # --sip-auth-file: digest challenges for callers (caller_auth.py)
        self.caller_auth = CallerAuth(config.caller_auth) if config.caller_auth else None

    # -- lifetime ---------------------------------------------------------------------------

    async def start(self) -> int:
        port = await self.transports.start(self.config.listen_host, self.config.listen_port)
        tls = self.config.tls
        if tls is not None:
            tls_port = await self.transports.start_tls(tls.host, tls.port,
                                                       sip_tls.server_context(tls),
                                                       sip_tls.client_context(tls))
            log.info("sip: listening on tls %s:%d", tls.host, tls_port)
        if self.config.webhook_url:
            self._http = aiohttp.ClientSession()
            log.info("sip: incoming calls wait up to %g s for an accept or reject after the "
                     "webhook to %s", self.config.accept_timeout,
                     printable(self.config.webhook_url))
        log.info("sip: listening on udp+tcp %s:%d (advertised as %s)",
                 self.config.listen_host, port, self.config.advertised_host)
        return port

    @property
    def port(self) -> int:
        return self.transports.port

    def port_for(self, transport: str) -> int:
        """The port this agent is reached at over `transport` (TLS listens apart)."""
        return self.transports.tls_port if transport == "TLS" else self.transports.port

    async def stop(self) -> None:
        """End every call (BYE where answered, 503 where still ringing), give the BYEs a
        moment to be answered, then close everything."""
        for call in list(self.calls.values()):
            if call.state == InboundState.EARLY:
                self._reject(call, 503, headers=[("Retry-After", str(RETRY_AFTER_SECONDS))])
            elif call.state in (InboundState.AWAITING_ACK, InboundState.CONFIRMED):
                self._detach_leg(call, EndReason.SHUTDOWN)
                self._hangup(call, EndReason.SHUTDOWN)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while self.tasks and time.monotonic() < deadline:  # the BYEs, until answered
            await asyncio.sleep(0.05)
        for call in list(self.calls.values()):
            self._forget(call)
        cancelled = self.tasks.cancel_all()
        if cancelled:
            await asyncio.gather(*cancelled, return_exceptions=True)
        self.transactions.close()
        await self.transports.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        log.info("sip: stopped")

    def stats(self) -> dict[str, object]:
        states = Counter(call.state for call in self.calls.values())
        setup = sorted(self.setup_ms)
        return {
            "listen": f"{self.config.listen_host}:{self.port}",
            "calls": len(self.calls),
            "call_states": dict(states),
            "transactions": self.transactions.stats(),
            "transport": self.transports.stats(),
            "tasks": len(self.tasks),
            "counters": dict(self.counters),
            "guard": self.guard.stats(),
            "budget": {**self.budget.stats(), **self.transaction_cap.stats()},
            "invite_to_200_ms": {
                "count": len(setup),
                "p50": round(setup[len(setup) // 2], 2) if setup else None,
                "p95": round(setup[min(len(setup) - 1, int(len(setup) * 0.95))], 2)
                if setup else None,
            },
        }

    # -- inbound ----------------------------------------------------------------------------

    def _allowed(self, host: str) -> bool:
        return refusal_for(host, self.config.allowed_networks) is None

    def _note(self, counter: str, message: str, *args: object) -> None:
        self.counters[counter] += 1
        held = self._noise.admit()
        if held is not None:
            log.info("sip: " + message + "%s", *args, held_back_note(held, "lines"))

    def _on_message(self, data: bytes, flow: Flow) -> None:
        self.counters["messages_in"] += 1
        if not self.budget.admit(flow.remote[0]):
            return  # over its source's --sip-message-rate: dropped unparsed (budget.py)
        result = parse_message(data, stream=flow.reliable,
                               max_bytes=self.config.max_message_bytes)
        if isinstance(result, ParseFailure):
            self._on_failure(result, flow)
            return
        if not self._allowed(flow.remote[0]):
            self._note("forbidden", "%s from %s, outside --sip-allow", type(result).__name__,
                       flow.remote[0])
            if isinstance(result, SipRequest) and result.method != "ACK":
                self._reply_stateless(result, flow, 403)
            return
        try:
            if isinstance(result, SipResponse):
                if not self.transactions.receive_response(result):
                    self.counters["stray_responses"] += 1
                return
            self._on_request(result, flow)
        except Exception:
            self.counters["internal_errors"] += 1
            log.exception("sip: failed to handle a message from %s", flow.remote[0])
            if isinstance(result, SipRequest) and result.method != "ACK":
                self._reply_stateless(result, flow, 500)

    def _on_failure(self, failure: ParseFailure, flow: Flow) -> None:
        if not self._allowed(flow.remote[0]):
            self.counters["forbidden"] += 1
            return
        if failure.code == "empty":
            return  # a keep-alive
        self._note("malformed", "unusable message from %s: %s (%s)", flow.remote[0],
                   failure.code, printable(failure.message))
        partial = failure.partial
        if failure.status is None or partial is None or partial.method == "ACK":
            return
        if not partial.headers.get_all("via"):
            return  # nowhere to address an answer
        self._reply_stateless(partial, flow, failure.status,
                              headers=[("Warning", f'399 {SERVER_NAME} "{failure.code}"')])

    def _on_request(self, request: SipRequest, flow: Flow) -> None:
        self._stamp_via(request, flow)
        if not self._from_dialog_peer(request, flow):
            return
        if request.method == "ACK":
            self._on_ack(request, flow)
            return
        existing = self.transactions.find_server(request)
        if existing is not None:
            self.counters["retransmissions_absorbed"] += 1
            existing.on_request(request)
            return
        if self._guarded(request, flow):
            return
        tx = self.transactions.new_server(request, self._response_sender(request, flow),
                                          flow.reliable)
        if request.method == "INVITE":
            tx.respond(self._response(request, 100))
        unsupported = self._unsupported(request)
        if unsupported:
            tx.respond(self._response(request, 420, headers=[("Unsupported", unsupported)]))
            return
        if request.to_addr.tag and self.dialog_hooks.handle(dialog_id_of(request), request, tx):
            return
        if self.caller_auth is not None and not request.to_addr.tag:
            auth_refusal = self.caller_auth.check(request)
            if auth_refusal is not None:
                self.counters[auth_refusal.code] += 1
                tx.respond(self._response(request, auth_refusal.status,
                                          reason=auth_refusal.reason,
                                          headers=auth_refusal.headers))
                return
        method = request.method
        if method == "INVITE":
            assert isinstance(tx, InviteServerTransaction)
            if request.to_addr.tag:
                self._on_reinvite(request, tx)
            else:
                self._on_invite(request, tx, flow)
        elif method == "BYE":
            self._on_bye(request, tx)
        elif method == "CANCEL":
            self._on_cancel(request, tx)
        elif method == "OPTIONS":
            self._on_options(request, tx)
        elif method == "UPDATE":
            self._on_update(request, tx)
        elif method in KNOWN_UNSUPPORTED:
            tx.respond(self._response(request, 405, headers=[("Allow", ALLOW)]))
        else:
            tx.respond(self._response(request, 501, headers=[("Allow", ALLOW)]))

    def _guarded(self, request: SipRequest, flow: Flow) -> bool:
        """guard.py: True when the request was refused statelessly, as a new INVITE over the
        source's rate or past the transaction cap (503 or nothing)."""
        source = flow.remote[0]
        if (len(self.transactions.servers) >= self.config.budget.max_transactions > 0
                and not self._in_live_dialog(request)):
            verdict = self.transaction_cap.decide(len(self.transactions.servers))
            if verdict == "refuse":
                self._reply_stateless(request, flow, 503, headers=[
                    ("Retry-After", str(CAP_RETRY_AFTER))])
            return verdict != "admit"
        if request.method == "INVITE" and not request.to_addr.tag:
            decision = self.guard.decide(source)
            if decision.verdict is Verdict.REFUSE:
                self._reply_stateless(request, flow, 503, headers=[
                    ("Retry-After", str(decision.retry_after))])
            return decision.verdict is not Verdict.ADMIT
        return False

    def _from_dialog_peer(self, request: SipRequest, flow: Flow) -> bool:
        """dialog_guard.py, for inbound and outbound calls alike: False when a request in a
        live dialog (or the CANCEL of a ringing call) came from a transport address that is
        not the dialog's; it was refused (403, an ACK dropped) and the call is untouched."""
        sources: frozenset[str] | None = None
        if request.method == "CANCEL":
            invite_tx = self.transactions.find_invite(request)
            call = self._by_invite.get(server_key(invite_tx.request)) if invite_tx else None
        elif request.to_addr.tag:
            call = self.calls.get(dialog_id_of(request))
            if call is None:
                sources = self.dialog_sources.get(dialog_id_of(request))
        else:
            return True
        if call is not None and call.state != InboundState.ENDED:
            sources = dialog_sources(call.invite, call.flow.remote[0], call.dialog)
        source = flow.remote[0]
        if sources is None or source_allowed(sources, source):
            return True
        self._note("spoofed_in_dialog", "%s in dialog %s from %s, not its peer or proxy: %s",
                   request.method, printable(request.call_id), source,
                   "dropped" if request.method == "ACK" else "403")
        if request.method != "ACK":
            self._reply_stateless(request, flow, 403)
        return False

    def _in_live_dialog(self, request: SipRequest) -> bool:
        """A request within a live call's dialog (exempt from --sip-max-transactions)."""
        if not request.to_addr.tag:
            return False
        dialog = dialog_id_of(request)
        return dialog in self.calls or dialog in self.dialog_hooks

    def _unsupported(self, request: SipRequest) -> str:
        if request.method in ("ACK", "CANCEL"):
            return ""
        return ", ".join(request.headers.get_all("require"))  # no extension is supported yet

    def _stamp_via(self, request: SipRequest, flow: Flow) -> None:
        """§18.2.1 and RFC 3581: note where the request really came from in its top Via,
        always: `received` is the transport's source address (whatever the sender wrote
        there is replaced) and `rport`, when present, its port. Nothing here is trusted as
        the source, though: checks take the flow's address (dialog_guard.py)."""
        values = request.headers.get_all("via")
        via = parse_via(values[0]) if values else None
        if via is None:
            return
        host, port = flow.remote[0], str(flow.remote[1])
        params = [(name, value) for name, value in via.params if name.lower() != "received"]
        params.append(("received", host))
        params = [(name, port if name.lower() == "rport" else value) for name, value in params]
        values[0] = str(type(via)(via.protocol, via.transport, via.host, via.port,
                                  tuple(params)))
        request.headers.replace_values("via", values)

    # -- responses --------------------------------------------------------------------------

    def _response_sender(self, request: SipRequest, flow: Flow) -> Send:
        """§18.2.2: over TCP back on the connection; over UDP to the source address, at the
        rport (RFC 3581) or the sent-by port."""
        if flow.reliable:
            return flow.send
        via = request.top_via
        port = flow.remote[1]
        if via is not None:
            rport = via.param("rport")
            port = int(rport) if rport and rport.isdigit() else (via.port or 5060)
        return self.transports.udp_sender((flow.remote[0], port))

    def _response(self, request: SipRequest, status: int, *, to_tag: str | None = None,
                  headers: list[tuple[str, str]] | None = None, body: bytes = b"",
                  content_type: str | None = None, reason: str | None = None) -> SipResponse:
        """§8.2.6: a response to `request` (Via, From, To, Call-ID, CSeq copied; a tag, ours
        for the call or a fresh one, added to To when it has none, except on 100)."""
        out = Headers()
        for value in request.headers.lines("via"):
            out.add("Via", value)
        for name in ("from", "to", "call-id", "cseq"):
            copied = request.headers.get(name)
            if copied is None:
                continue
            if name == "to" and status > 100 and request.to_addr.tag is None:
                copied = f"{copied};tag={to_tag or new_tag()}"
            out.add(name, copied)
        if (request.method == "INVITE" and 100 < status < 300
                and request.to_addr.tag is None):
            for route in request.headers.lines("record-route"):
                out.add("Record-Route", route)  # §12.1.1: the route set goes back
        if status == 100 and "timestamp" in request.headers:
            out.add("Timestamp", request.headers.get("timestamp") or "")
        out.add("Server", SERVER_NAME)
        for name, value in headers or []:
            out.add(name, value)
        if body:
            out.add("Content-Type", content_type or "application/sdp")
        return SipResponse(headers=out, body=body, status=status,
                           reason=reason or REASONS.get(status, "Unknown"))

    def _reply_stateless(self, request: SipRequest, flow: Flow, status: int,
                         headers: list[tuple[str, str]] | None = None) -> None:
        try:
            self._response_sender(request, flow)(
                self._response(request, status, headers=headers).to_bytes())
        except (OSError, ConnectionError) as exc:
            log.debug("sip: could not send %d: %r", status, exc)

    def _contact(self, transport: str) -> str:
        host = self.config.advertised_host
        host = f"[{host}]" if ":" in host else host
        suffix = f";transport={transport.lower()}" if transport in ("TCP", "TLS") else ""
        return f"<sip:agent@{host}:{self.port_for(transport)}{suffix}>"

    # -- new calls --------------------------------------------------------------------------

    def _admission_refusal(self) -> tuple[int, str] | None:
        if not self.agent.started:
            return 503, "Not Ready"
        if self.agent.draining:
            return 503, "Draining"
        if not self.agent.has_room:
            return 503, "Server Full"
        return None

    def _on_invite(self, request: SipRequest, tx: InviteServerTransaction, flow: Flow) -> None:
        self.counters["invites"] += 1
        remote_key = (request.call_id, request.from_addr.tag or "")
        if remote_key in self._by_remote:
            # §8.2.2.2: the same request by another path (a fork merged back, a loop).
            tx.respond(self._response(request, 482))
            return
        refusal = self._admission_refusal()
        if refusal is not None:
            self.counters["refused_" + refusal[1].lower().replace(" ", "_")] += 1
            tx.respond(self._response(request, refusal[0], reason=refusal[1],
                                      headers=[("Retry-After", str(RETRY_AFTER_SECONDS))]))
            return
        if not request.body:  # a late offer: ours in the 200, the answer in the ACK
            ours = own_offer(self.config.srtp)
            problem: SipResponse | tuple[SessionDescription, AudioChoice,
                                         sdes.SdesAnswer | None] = (ours.offer, ours.choice,
                                                                    ours.srtp)
        else:
            problem = self._offer_problem(request)
        if isinstance(problem, SipResponse):
            self.counters["refused_offer"] += 1
            tx.respond(problem)
            return
        offer, choice, secured = problem
        local_tag = new_tag()
        dialog = Dialog.from_invite(request, local_tag, flow.transport)
        if dialog is None:
            tx.respond(self._response(request, 400, to_tag=local_tag,
                                      reason="Missing or Invalid Contact"))
            return
        call = SipCall(request, tx, flow, dialog, offer, choice, srtp=secured,
                       awaiting_answer=not request.body)
        call.ack_cseq = request.cseq.number
        self.calls[dialog.id] = call
        self._by_invite[server_key(request)] = call
        self._by_remote[remote_key] = call
        self._by_api_id[call.api_id] = call
        tx.respond(self._response(request, 180, to_tag=local_tag,
                                  headers=[("Contact", self._contact(flow.transport))]))
        call.tasks.spawn(self._answer(call), "answer")

    def _offer_problem(self, request: SipRequest,
                       codecs: tuple[str, ...] = SIP_CODECS,
                       to_tag: str | None = None, local_key: bytes | None = None
                       ) -> SipResponse | tuple[SessionDescription, AudioChoice,
                                                sdes.SdesAnswer | None]:
        """The offer, the stream chosen from it and its SRTP agreement (sdes.py), or the
        response refusing it."""
        tag = to_tag or new_tag()
        if not request.body:
            return self._response(request, 488, to_tag=tag, headers=[
                ("Warning", (f'399 {SERVER_NAME} "an INVITE without an SDP offer is not '
                             'served yet"'))])
        if request.content_type != "application/sdp":
            return self._response(request, 415, to_tag=tag,
                                  headers=[("Accept", "application/sdp")])
        offer = parse_sdp(request.body)
        choice = (choose_audio(offer, codecs, protos=sdes.protos_for(self.config.srtp))
                  if not isinstance(offer, SdpError) else offer)
        if isinstance(choice, SdpError):
            return self._response(request, choice.status, to_tag=tag, headers=[
                ("Warning", f'{choice.warning} {SERVER_NAME} "{choice.message}"')])
        assert not isinstance(offer, SdpError)
        if choice.remote is not None:
            refusal = refusal_for(choice.remote[0], self.rtp.allowed_networks)
            if refusal is not None:
                return self._response(request, 488, to_tag=tag, headers=[
                    ("Warning", (f'399 {SERVER_NAME} "{refusal.code}: media address '
                                 f'{choice.remote[0]} not allowed (--rtp-allow)"'))])
        secured = sdes.negotiate(request.body, choice, self.config.srtp, local_key)
        if isinstance(secured, SdpError):
            return self._response(request, secured.status, to_tag=tag, headers=[
                ("Warning", f'{secured.warning} {SERVER_NAME} "{secured.message}"')])
        return offer, choice, secured

    async def _answer(self, call: SipCall) -> None:
        if self.config.ring_seconds > 0:
            await asyncio.sleep(self.config.ring_seconds)
        if self.admitting is not None and not self.admitting.is_set():
            # Start-up: another worker still starting would share the cores with the call.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.admitting.wait(), ADMITTING_WAIT_S)
        session, owner = None, SIP_OWNER
        if self.config.webhook_url:
            decision = await self._await_decision(call)
            if decision is None:
                return
            session, owner = decision
        try:
            leg = await open_sip_leg(self.agent, call.choice, self.rtp, call.dialog.call_id,
                                     self._on_leg_closed, leg_id=call.api_id,
                                     session=session, owner=owner,
                                     srtp=call.srtp.keys if call.srtp else None,
                                     media_timeout=self.config.media_timeout)
        except AgentError as exc:
            self._settle(call, exc)
            busy = exc.status == 503
            self.counters["refused_" + exc.code] += 1
            log.info("sip: call %s refused: %s", printable(call.dialog.call_id), exc.code)
            self._reject(call, 503 if busy else 500, reason=exc.code.replace("_", " ").title(),
                         headers=[("Retry-After", str(RETRY_AFTER_SECONDS))] if busy else [])
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("sip: opening the media for %s failed", printable(call.dialog.call_id))
            self._settle(call, CallError("setup_failed", "the call's media could not be opened",
                                         status=500))
            self._reject(call, 500)
            return
        # Cancelled, or hung up, while the leg was being opened.
        if call.state != InboundState.EARLY:
            leg.on_closed = None
            await leg.close(EndReason.CANCELLED)
            return
        call.leg = leg
        self._by_leg[leg.id] = call
        call.local_sdp = self._local_sdp(call, call.offer, call.choice,
                                         "sendrecv" if call.awaiting_answer else None)
        ok = self._ok(call, call.invite, call.local_sdp)
        self.counters["answered"] += 1
        self.setup_ms.append((time.monotonic() - call.received_at) * 1000)
        log.info("sip: call %s answered on leg %s (%s, remote %s)",
                 printable(call.dialog.call_id), leg.id, call.choice.codec.name,
                 call.choice.remote)
        self._send_2xx(call, call.invite_tx, ok)
        self._settle(call, None)

    # -- the application's answer (--sip-webhook) ---------------------------------------------

    async def _await_decision(self, call: SipCall) -> tuple[SessionConfig, Principal] | None:
        """Post realtime.call.incoming and wait for accept or reject; None when the call was
        rejected here (by the application, or 480 after --sip-accept-timeout)."""
        call.decision = asyncio.get_running_loop().create_future()
        call.tasks.spawn(self._post_webhook(call), "webhook")
        try:
            decision = await asyncio.wait_for(asyncio.shield(call.decision),
                                              self.config.accept_timeout)
        except asyncio.TimeoutError:
            self.counters["accept_timeouts"] += 1
            log.info("sip: call %s not accepted within %g s: 480", call.api_id,
                     self.config.accept_timeout)
            self._reject(call, 480)
            return None
        if isinstance(decision, int):
            self.counters["rejected_by_application"] += 1
            log.info("sip: call %s rejected by the application: %d", call.api_id, decision)
            self._reject(call, decision)
            return None
        return decision

    def incoming_event(self, call: SipCall) -> dict[str, object]:
        return {
            "object": "event",
            "id": "evt_" + secrets.token_hex(12),
            "type": "realtime.call.incoming",
            "created_at": int(time.time()),
            "data": {
                "call_id": call.api_id,
                "sip_headers": [{"name": name, "value": value}
                                for name, value in call.invite.headers],
            },
        }

    async def _post_webhook(self, call: SipCall) -> None:
        """POST realtime.call.incoming, signed as Standard Webhooks. A failure is logged once;
        the call then waits out the accept timeout like an unanswered one."""
        assert self._http is not None and self._webhook is not None
        url = self.config.webhook_url
        assert url is not None
        body = json.dumps(self.incoming_event(call)).encode()
        headers = signed_headers(self._webhook, new_message_id(), body)
        self.counters["webhooks_sent"] += 1
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.accept_timeout)
            async with self._http.post(url, data=body, headers=headers,
                                       timeout=timeout) as reply:
                status = reply.status
                await reply.read()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.counters["webhook_failures"] += 1
            log.warning("sip: webhook for call %s failed: %r; it gets 480 unless accepted "
                        "within %g s", call.api_id, exc, self.config.accept_timeout)
            return
        if not 200 <= status < 300:
            self.counters["webhook_failures"] += 1
            log.warning("sip: webhook for call %s answered %d; it gets 480 unless accepted "
                        "within %g s", call.api_id, status, self.config.accept_timeout)

    def find_call(self, api_id: str) -> SipCall | None:
        """An inbound call by its API id (pending, answered or ringing), else None."""
        call = self._by_api_id.get(api_id)
        return call if call is not None and call.state != InboundState.ENDED else None

    async def accept(self, call: SipCall, session: SessionConfig, owner: Principal) -> None:
        """The application accepts a pending call: answered with `session`, owned by
        `owner`. Raises the AgentError that kept it from being answered."""
        assert call.pending and call.decision is not None
        call.outcome = asyncio.get_running_loop().create_future()
        call.decision.set_result((session, owner))
        error = await asyncio.shield(call.outcome)
        if error is not None:
            raise error

    def reject(self, call: SipCall, status: int) -> None:
        """The application rejects a pending call with this final status (400-699)."""
        assert call.pending and call.decision is not None
        call.decision.set_result(status)

    @staticmethod
    def _settle(call: SipCall, error: AgentError | None) -> None:
        if call.outcome is not None and not call.outcome.done():
            call.outcome.set_result(error)

    def _local_sdp(self, call: SipCall, offer: SessionDescription, choice: AudioChoice,
                   direction: str | None = None) -> bytes:
        assert call.leg is not None
        return build_answer(offer, choice, self._sdp_host(), call.leg.local[1],
                            call.sdp_session, call.sdp_version, direction,
                            (call.srtp.line,) if call.srtp else ())

    def _sdp_host(self) -> str:
        """Where RTP is reached: --rtp-advertise, else --sip-advertise when RTP binds a
        wildcard, else the RTP bind address."""
        if self.rtp.advertised_host:
            return self.rtp.advertised_host
        if self.rtp.bind_host in WILDCARDS and self.config.advertise:
            return self.config.advertise
        return self.rtp.bind_host

    def _ok(self, call: SipCall, request: SipRequest, sdp: bytes) -> SipResponse:
        return self._response(request, 200, to_tag=call.dialog.local_tag, body=sdp, headers=[
            ("Contact", self._contact(call.flow.transport)), ("Allow", ALLOW),
            ("Supported", "")])

    def _reject(self, call: SipCall, status: int, *, reason: str | None = None,
                headers: list[tuple[str, str]] | None = None) -> None:
        """Answer the pending INVITE with a final failure and free the call."""
        if not call.invite_tx.final_sent:
            call.invite_tx.respond(self._response(call.invite, status,
                                                  to_tag=call.dialog.local_tag, reason=reason,
                                                  headers=headers))
        self._end(call, EndReason.REJECTED)

    # -- 2xx retransmission and ACK (§13.3.1.4) ---------------------------------------------

    def _send_2xx(self, call: SipCall, tx: InviteServerTransaction, ok: SipResponse) -> None:
        call.state = InboundState.AWAITING_ACK
        call.ack_cseq = tx.request.cseq.number
        tx.respond(ok)
        settings = self.config.timers
        if not call.flow.reliable:
            retransmit_2xx(self.timers, settings, tx.send, ok.to_bytes(),
                           lambda: call.state == InboundState.AWAITING_ACK, call.timers)
        call.timers["no_ack"] = self.timers.call_later(settings.timeout,
                                                       lambda: self._no_ack(call))

    def _stop_2xx(self, call: SipCall) -> None:
        for name in ("2xx", "no_ack"):
            handle = call.timers.pop(name, None)
            if handle is not None:
                handle.cancel()

    def _no_ack(self, call: SipCall) -> None:
        if call.state != InboundState.AWAITING_ACK:
            return
        log.info("sip: no ACK for the 2xx of %s within %g s; ending it",
                 printable(call.dialog.call_id), self.config.timers.timeout)
        self.counters["no_ack"] += 1
        self._stop_2xx(call)
        self._detach_leg(call, EndReason.NO_ACK)
        self._hangup(call, call.bye_reason or EndReason.NO_ACK)

    def _on_ack(self, ack: SipRequest, flow: Flow) -> None:
        tx = self.transactions.find_server(ack)
        if isinstance(tx, InviteServerTransaction) and tx.state in (COMPLETED, TX_CONFIRMED):
            tx.on_request(ack)  # the ACK of a non-2xx: the transaction's business
            return
        call = self.calls.get(dialog_id_of(ack))
        if call is None and self.dialog_hooks.ack(dialog_id_of(ack), ack):
            return  # the ACK of a 2xx in an outbound call's dialog (hooks.py)
        if (call is None or call.state != InboundState.AWAITING_ACK
                or ack.cseq.number != call.ack_cseq):
            self.counters["stray_acks"] += 1
            return
        self._stop_2xx(call)
        call.state = InboundState.CONFIRMED
        if call.awaiting_answer and call.bye_reason is None:
            self._take_answer(call, ack)
        if call.leg is not None:
            call.leg.vouch(flow.remote[0])  # media on the ACK's host: no need to hear it first
        if call.bye_reason is not None:
            self._hangup(call, call.bye_reason)

    # -- requests in a dialog ---------------------------------------------------------------

    def _in_dialog(self, request: SipRequest, tx: ServerTransaction) -> SipCall | None:
        """The request's call, its CSeq checked (§12.2.2); None when answered already."""
        call = self.calls.get(dialog_id_of(request))
        if call is None or call.state == InboundState.ENDED:
            self.counters["unknown_dialog"] += 1
            tx.respond(self._response(request, 481))
            return None
        if request.cseq.number < call.dialog.remote_seq:
            tx.respond(self._response(request, 500, reason="CSeq Out of Order"))
            return None
        call.dialog.remote_seq = request.cseq.number
        return call

    def _on_bye(self, request: SipRequest, tx: ServerTransaction) -> None:
        call = self._in_dialog(request, tx)
        if call is None:
            return
        tx.respond(self._response(request, 200))
        if call.state == InboundState.EARLY and not call.invite_tx.final_sent:
            call.invite_tx.respond(self._response(call.invite, 487,
                                                  to_tag=call.dialog.local_tag))
        self.counters["remote_hangups"] += 1
        self._end(call, EndReason.REMOTE_HANGUP)

    def _on_cancel(self, request: SipRequest, tx: ServerTransaction) -> None:
        invite_tx = self.transactions.find_invite(request)
        if invite_tx is None:
            self.counters["unknown_dialog"] += 1
            tx.respond(self._response(request, 481))
            return
        call = self._by_invite.get(server_key(invite_tx.request))
        to_tag = call.dialog.local_tag if call is not None else new_tag()
        tx.respond(self._response(request, 200, to_tag=to_tag))
        if invite_tx.final_sent:
            return  # answered already: the CANCEL changes nothing (§9.2)
        invite_tx.respond(self._response(invite_tx.request, 487, to_tag=to_tag))
        self.counters["cancelled"] += 1
        if call is not None:
            self._end(call, EndReason.CANCELLED)

    def _on_reinvite(self, request: SipRequest, tx: InviteServerTransaction) -> None:
        call = self.calls.get(dialog_id_of(request))
        if call is not None and call.state in (InboundState.EARLY, InboundState.AWAITING_ACK):
            tx.respond(self._response(request, 491))  # an offer/answer is still open
            return
        call = self._in_dialog(request, tx)
        if call is None:
            return
        if call.state != InboundState.CONFIRMED or call.leg is None:
            tx.respond(self._response(request, 481))
            return
        if not request.body:  # offerless: our offer in the 200, the answer in the ACK
            call.dialog.refresh_target(request)
            call.sdp_version += 1
            call.local_sdp = self._local_sdp(call, call.offer, call.choice, "sendrecv")
            call.awaiting_answer = True
            self.counters["reinvites"] += 1
            self._send_2xx(call, tx, self._ok(call, request, call.local_sdp))
            return
        answer = self._reoffer(call, request)
        if isinstance(answer, SipResponse):
            self.counters["reinvite_refused"] += 1
            tx.respond(answer)  # the call goes on as it was
            return
        self.counters["reinvites"] += 1
        self._send_2xx(call, tx, self._ok(call, request, answer))

    def _reoffer(self, call: SipCall, request: SipRequest) -> bytes | SipResponse:
        """A new offer within the call (re-INVITE or UPDATE): applied to the leg and
        answered (the SDP), or the response refusing it, the call unchanged."""
        assert call.leg is not None
        problem = self._offer_problem(request, (call.choice.codec.name,), call.dialog.local_tag,
                                      call.srtp.keys.local_key if call.srtp else None)
        if isinstance(problem, SipResponse):
            return problem
        offer, choice, secured = problem
        if (secured is None) != (call.srtp is None):
            return self._response(request, 488, headers=[
                ("Warning", f'399 {SERVER_NAME} "SRTP cannot be turned on or off in a call"')])
        if secured is not None and call.leg.srtp is not None:
            call.leg.srtp.rekey_inbound(secured.keys)
            call.srtp = secured
        call.offer, call.choice = offer, choice
        call.leg.apply(choice, choice.answer_direction)
        call.dialog.refresh_target(request)
        call.sdp_version += 1
        call.local_sdp = self._local_sdp(call, offer, choice)
        log.info("sip: call %s %s: %s, remote %s", printable(call.dialog.call_id),
                 request.method, choice.answer_direction, choice.remote)
        return call.local_sdp

    def _on_update(self, request: SipRequest, tx: ServerTransaction) -> None:
        """RFC 3311: an offer (hold/resume, a moved address) answered in the 200 at once;
        without SDP, a target refresh. 491 while an offer/answer of the call is open."""
        call = self._in_dialog(request, tx)
        if call is None:
            return
        contact = [("Contact", self._contact(call.flow.transport)), ("Allow", ALLOW)]
        if not request.body:
            call.dialog.refresh_target(request)
            tx.respond(self._response(request, 200, headers=contact))
            return
        if call.leg is None or call.state == InboundState.EARLY or call.awaiting_answer:
            tx.respond(self._response(request, 491))
            return
        answer = self._reoffer(call, request)
        if isinstance(answer, SipResponse):
            self.counters["update_refused"] += 1
            tx.respond(answer)
            return
        self.counters["updates"] += 1
        tx.respond(self._response(request, 200, body=answer, headers=contact))

    def _take_answer(self, call: SipCall, ack: SipRequest) -> None:
        """The answer in the ACK to our offer (late offer, offerless re-INVITE); a missing
        or unusable one ends the call with a BYE (RFC 3261 §13.3.1.4)."""
        call.awaiting_answer = False
        leg = call.leg
        if leg is None:
            return
        local_key = call.srtp.keys.local_key if call.srtp else None
        taken = take_answer(ack.body, ack.content_type if ack.body else None, call.choice,
                            local_key, self.rtp.allowed_networks)
        if isinstance(taken, SdpError):
            self.counters["bad_answers"] += 1
            log.info("sip: call %s: unusable answer in the ACK (%s); ending it",
                     printable(call.dialog.call_id), taken.code)
            self._detach_leg(call, EndReason.BAD_ANSWER)
            call.bye_reason = EndReason.BAD_ANSWER
            return
        if taken.srtp is not None and leg.srtp is not None:
            leg.srtp.rekey_inbound(taken.srtp)
        call.offer, call.choice = taken.answer, taken.choice
        leg.dtmf_payload_type = taken.choice.dtmf_payload_type
        leg.apply(taken.choice, taken.choice.answer_direction)
        self.counters["late_answers"] += 1

    def _on_options(self, request: SipRequest, tx: ServerTransaction) -> None:
        refusal = self._admission_refusal()
        headers = [("Allow", ALLOW), ("Accept", "application/sdp"),
                   ("Accept-Encoding", "identity"), ("Accept-Language", "en")]
        if refusal is not None:
            headers.append(("Retry-After", str(RETRY_AFTER_SECONDS)))
            tx.respond(self._response(request, refusal[0], reason=refusal[1],
                                      headers=headers))
            return
        tx.respond(self._response(request, 200, headers=headers))

    # -- ending calls -----------------------------------------------------------------------

    def _on_leg_closed(self, leg: SipRtpLeg, reason: Ending) -> None:
        """The media leg ended (hang-up over HTTP, media timeout, drain, shutdown...)."""
        call = self._by_leg.pop(leg.id, None)
        if call is None or call.state in (InboundState.ENDING, InboundState.ENDED):
            return
        call.leg = None
        if call.state == InboundState.AWAITING_ACK:
            call.bye_reason = reason  # §15: no BYE before the ACK (or its timeout)
            return
        self._hangup(call, reason)

    def _detach_leg(self, call: SipCall, reason: Ending) -> None:
        leg, call.leg = call.leg, None
        if leg is None:
            return
        self._by_leg.pop(leg.id, None)
        leg.on_closed = None
        self.tasks.spawn(leg.close(reason), "leg-close")

    def _end(self, call: SipCall, reason: Ending) -> None:
        """The call is over without a BYE of ours (theirs came, or it never got answered)."""
        self._detach_leg(call, reason)
        self._forget(call)

    def _forget(self, call: SipCall) -> None:
        call.state = InboundState.ENDED
        call.stop_timers()
        self._settle(call, CallError("call_ended", "the call ended before it was answered",
                                     status=409))
        call.tasks.cancel_all()
        if self._by_api_id.get(call.api_id) is call:
            del self._by_api_id[call.api_id]
        if self.calls.get(call.dialog_id) is call:
            del self.calls[call.dialog_id]
        key = server_key(call.invite)
        if self._by_invite.get(key) is call:
            del self._by_invite[key]
        remote_key = (call.dialog.call_id, call.dialog.remote_tag)
        if self._by_remote.get(remote_key) is call:
            del self._by_remote[remote_key]
        if call.leg is not None:
            self._by_leg.pop(call.leg.id, None)

    def _hangup(self, call: SipCall, reason: Ending) -> None:
        if call.state in (InboundState.ENDING, InboundState.ENDED):
            return
        self._stop_2xx(call)
        call.state = InboundState.ENDING
        self.counters["agent_hangups"] += 1
        self.tasks.spawn(self._send_bye(call, reason), "bye")

    async def _send_bye(self, call: SipCall, reason: Ending) -> None:
        try:
            transport = call.flow.transport
            request, hop = call.dialog.request("BYE", self.config.advertised_host,
                                               self.port_for(transport), transport)
            request.headers.add("Reason", f'SIP;cause=200;text="{reason}"')
            flow = await self._flow_for(call, hop)
            if flow is None:
                return
            if flow.transport != transport:
                request, hop = call.dialog.request("BYE", self.config.advertised_host,
                                                   self.port_for(flow.transport),
                                                   flow.transport)
                request.headers.add("Reason", f'SIP;cause=200;text="{reason}"')
            status = await self.transactions.final_status(request, flow.send, flow.reliable)
            log.info("sip: call %s ended (%s); BYE answered %d", printable(call.dialog.call_id),
                     reason, status)
        finally:
            self._forget(call)

    async def _flow_for(self, call: SipCall, hop: Uri) -> Flow | None:
        return await self.flow_for(call.flow, hop, call.dialog.call_id)

    async def flow_for(self, flow: Flow, hop: Uri, sip_call_id: str) -> Flow | None:
        """How to reach the next hop of an in-dialog request: the dialog's own TCP connection
        (`flow`) while it is open, else the hop's address (A/AAAA lookup; no NAPTR/SRV yet).
        None (logged) when it cannot be reached or is outside --sip-allow."""
        wanted = hop.param("transport")
        if (flow.reliable and (wanted is None or wanted.upper() == flow.transport)
                and flow.remote in self.transports.connections):
            return flow
        transport = (wanted or ("TCP" if flow.reliable else "UDP")).upper()
        host = hop.param("maddr") or hop.host
        try:
            address = await self._resolve(host, hop.effective_port)
            if not self._allowed(address[0]):
                log.warning("sip: not sending to %s: outside --sip-allow", address[0])
                return None
            return await self.transports.flow_to(transport, address)
        except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
            log.info("sip: cannot reach %s for %s: %r", printable(str(hop)),
                     printable(sip_call_id), exc)
            return None

    @staticmethod
    async def _resolve(host: str, port: int) -> tuple[str, int]:
        try:
            return str(ipaddress.ip_address(host)), port
        except ValueError:
            pass
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(f"{host} does not resolve")
        return str(infos[0][4][0]), port

