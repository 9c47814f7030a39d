"""Outbound SIP calls: the agent as the caller (UAC), placed by `POST /v1/sip/calls`.

A call is admitted (it holds a slot of `--max-sessions` while it rings), its session config
prepared and an RTP port bound before the INVITE leaves, so the offer names that port and a
refusal comes back to the HTTP caller at once. The INVITE goes on a client transaction
(transaction.py: Timer A retransmits over UDP, Timer B gives up, a non-2xx is ACKed there)
to the trunk's proxy, else to the target URI's host; it offers PCMU, PCMA and
telephone-event. Then:

- 18x: the call rings (`call.ringing`). A 183 with SDP is `call.early_media` and opens the
  RTP leg at once, so the plugin hears the ringback or announcement; the agent sends nothing
  until the 2xx (its watchdog starts then too), whose SDP, or else the 183's, sets the leg.
- 2xx: the dialog is made from it (§12.1.2: route set = Record-Route reversed, remote target
  = Contact), ACKed by the dialog (again for each retransmitted 2xx), and the RTP leg opened
  (unless early media opened it) on the answer's codec and address (media.py's `SipRtpLeg`,
  the same path inbound calls take), with the session config applied as for an accepted
  inbound call.
- 401/407: answered once with the trunk's credentials (digest.py), a new CSeq on the same
  Call-ID and From tag; a second challenge ends the call `auth_failed`.
- Other finals end it with a code: 486/600 `busy`, 480 `no_answer`, 404/604 `not_found`,
  408 or Timer B `timeout`, the rest `rejected` (the status kept in `sip_status`).
- No answer within the ring timeout (`--sip-ring-timeout`, or the request's): CANCEL, ended
  `no_answer`. A hang-up before the answer is a CANCEL too (sent once a provisional came,
  §9.1); after it a BYE. The far end's BYE ends it `remote_hangup`.

In the dialog, the far end's re-INVITE or UPDATE with an offer holds, resumes or moves the
call as on inbound calls (on the call's codec; `call.media_updated` notes the direction): the
2xx of a re-INVITE is retransmitted until its ACK (hooks.py's ACK hook); an offerless
re-INVITE gets the agent's offer and the answer comes in the ACK. Every request in the
dialog from a transport address that is not the dialog's (dialog_guard.py's
`outbound_dialog_sources`, registered with the user agent, which checks it for inbound and
outbound calls alike) gets 403 (an ACK is dropped) and counts as `spoofed_in_dialog`. A
REFER from the far end is answered 405 by the core (the agent does not transfer itself).
The answer's media address gets the agent's RTP at once when it is the host the INVITE
went to; another host only a short burst until its RTP is heard (media.py).

Each call keeps its state (calling, ringing, answered, ended), ending reason, SIP status and
events; ended calls stay readable (`GET /v1/sip/calls/{id}`) for a while, the newest
`RETAINED_ENDED` of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from agent.end_reason import Ending, EndReason, WireEnum, coded
from agent.errors import AgentError, CallError
from agent.leg import PreparedConfig, prepare_config
from agent.logs.log_safe import printable
from agent.plugins.base import SessionConfig
from agent.task_owner import TaskOwner
from agent.telephony.rtp_leg import RtpProtocol, bind_rtp_port, check_remote
from agent.worker_tag import ID_TOKEN_BYTES, tagged_token
from signaling.auth import Principal
from signaling.sip.dialog import Dialog, new_branch, new_tag
from signaling.sip.dialog_guard import outbound_dialog_sources
from signaling.sip.digest import answer as digest_answer
from signaling.sip.digest import best_challenge
from signaling.sip.hooks import DialogHook
from signaling.sip.media import SipRtpLeg, wire_sip_leg
from signaling.sip.message import Headers, SipRequest, SipResponse
from signaling.sip.sdp import AudioChoice, SdpError, build_answer, choose_audio, parse_sdp
from signaling.sip.timers import TimerHandle
from signaling.sip.transaction import (
    ClientTransaction,
    InviteServerTransaction,
    ServerTransaction,
    retransmit_2xx,
)
from signaling.sip.transport import Flow
from signaling.sip.trunks import Trunk
from signaling.sip.ua import ALLOW, SERVER_NAME, UserAgent
from signaling.sip.uri import Uri, format_host, parse_name_addr

log = logging.getLogger(__name__)

RETAINED_ENDED = 1000
MAX_EVENTS = 50
DTMF_PAYLOAD_TYPE = 101


class OutboundState(WireEnum):
    """An outbound call's state, as GET shows it; ANSWERED: the far end took the call."""

    CALLING = "calling"  # INVITE sent, nothing back yet
    RINGING = "ringing"  # a provisional answer came
    ANSWERED = "answered"  # the far end answered (2xx) and the agent ACKed
    ENDED = "ended"


ENDINGS = {486: EndReason.BUSY, 600: EndReason.BUSY, 480: EndReason.NO_ANSWER,
           404: EndReason.NOT_FOUND, 604: EndReason.NOT_FOUND, 408: EndReason.TIMEOUT,
           401: EndReason.AUTH_FAILED, 407: EndReason.AUTH_FAILED}


def ending_for(status: int) -> EndReason:
    """The coded ending of a final failure status."""
    return ENDINGS.get(status, EndReason.REJECTED)


def build_offer(host: str, port: int, session_id: int, version: int = 1,
                codec: tuple[int, str] | None = None) -> bytes:
    """The SDP offer of an outbound call: PCMU, PCMA and telephone-event, 20 ms; or only
    `codec` (payload type, encoding) for an offer within the call."""
    family = "IP6" if ":" in host else "IP4"
    codecs = [codec] if codec is not None else [(0, "PCMU"), (8, "PCMA")]
    formats = " ".join(str(pt) for pt, _ in codecs)
    lines = [
        "v=0", f"o=duplex-agent {session_id} {version} IN {family} {host}", "s=duplex-agent",
        f"c=IN {family} {host}", "t=0 0",
        f"m=audio {port} RTP/AVP {formats} {DTMF_PAYLOAD_TYPE}",
        *(f"a=rtpmap:{pt} {name}/8000" for pt, name in codecs),
        f"a=rtpmap:{DTMF_PAYLOAD_TYPE} telephone-event/8000",
        f"a=fmtp:{DTMF_PAYLOAD_TYPE} 0-16", "a=ptime:20", "a=sendrecv",
    ]
    return ("\r\n".join(lines) + "\r\n").encode("ascii")


@dataclass
class Placement:
    """A checked `POST /v1/sip/calls`: where to, as whom, through which trunk."""

    target: Uri
    trunk: Trunk | None = None
    from_value: str | None = None  # a name-addr without tag
    headers: list[tuple[str, str]] = field(default_factory=list)
    session: SessionConfig = field(default_factory=SessionConfig)
    ring_timeout: float | None = None


@dataclass
class OutboundCall:
    api_id: str  # the call's id in the HTTP API, and its leg's (`sip_call_id`: SIP's)
    owner: Principal
    placement: Placement
    flow: Flow
    sip_call_id: str
    local_tag: str
    from_value: str
    prepared: PreparedConfig
    rtp: tuple[asyncio.DatagramTransport, RtpProtocol, int]
    admission: contextlib.ExitStack
    state: OutboundState = OutboundState.CALLING
    reason: Ending | None = None
    sip_status: int | None = None
    cseq: int = 1
    invite: SipRequest | None = None
    invite_tx: ClientTransaction | None = None
    authenticated: bool = False
    provisional: bool = False
    cancel_reason: Ending | None = None  # a CANCEL is wanted (or sent) for this reason
    cancel_sent: bool = False
    dialog: Dialog | None = None
    ack: tuple[bytes, Flow] | None = None
    leg: SipRtpLeg | None = None
    slot_opened: bool = False
    hook: DialogHook | None = None  # its dialog's requests (hooks.py)
    early: asyncio.Task[None] | None = None  # the leg opening on a 183 with SDP
    early_response: SipResponse | None = None
    sdp_version: int = 1
    ack_cseq: int | None = None  # a re-INVITE's 2xx is retransmitted until this ACK
    awaiting_answer: bool = False  # our offer went in that 2xx: the answer is in the ACK
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))
    timers: dict[str, TimerHandle] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    answered_at: float | None = None
    ended_at: float | None = None

    @property
    def is_ended(self) -> bool:
        """Whether the call ended (a property: type checkers do not carry a check of `state`
        across an await, and the call may end during one)."""
        return self.state == OutboundState.ENDED

    def note(self, kind: str, **data: Any) -> None:
        event = {"type": kind, "created_at": round(time.time(), 3), **data}
        self.events.append(event)
        if self.leg is not None and not self.leg.closing:
            self.leg.emit(event)

    def describe(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.api_id, "object": "realtime.call", "direction": "outbound",
            "status": self.state, "to": str(self.placement.target),
            "trunk": self.placement.trunk.name if self.placement.trunk else None,
            "reason": self.reason, "sip_status": self.sip_status,
            "created_at": round(self.created_at, 3),
            "answered_at": round(self.answered_at, 3) if self.answered_at else None,
            "ended_at": round(self.ended_at, 3) if self.ended_at else None,
            "events": list(self.events),
        }
        if self.leg is not None and not self.leg.closing:
            body["stats"] = self.leg.stats()
        return body


class Dialer:
    """Every outbound call of one user agent."""

    def __init__(self, ua: UserAgent) -> None:
        self.ua = ua
        self.trunks = ua.config.trunks
        self.ring_timeout = ua.config.ring_timeout
        self.live: dict[str, OutboundCall] = {}
        self.ended: OrderedDict[str, OutboundCall] = OrderedDict()
        self._by_leg: dict[str, OutboundCall] = {}
        self.tasks = TaskOwner("sip-outbound")
        self.counters: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def find(self, api_id: str) -> OutboundCall | None:
        return self.live.get(api_id) or self.ended.get(api_id)

    def stats(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for call in self.live.values():
            states[call.state] = states.get(call.state, 0) + 1
        return {"live": len(self.live), "states": states, "counters": dict(self.counters),
                "trunks": {name: trunk.describe() for name, trunk in self.trunks.items()}}

    # -- placing a call ---------------------------------------------------------------------

    async def place(self, placement: Placement, owner: Principal) -> OutboundCall:
        """Send the INVITE; raises a coded AgentError (400 bad destination, 502 unreachable,
        503 full or not ready) before anything is sent."""
        ua, agent = self.ua, self.ua.agent
        if not agent.started:
            raise CallError("not_ready", "the plugin is not loaded yet", status=503)
        agent.check_capacity()
        hop = placement.trunk.proxy if placement.trunk else placement.target
        transport = placement.trunk.transport if placement.trunk else hop.transport
        if transport not in ("UDP", "TCP"):
            raise CallError("unsupported_transport", f"SIP over {transport} is not served for "
                            "outbound calls yet", param="to")
        try:
            address = await ua._resolve(hop.param("maddr") or hop.host, hop.effective_port)
        except OSError:
            raise CallError("destination_unresolved", f"{hop.host} does not resolve",
                            param="to") from None
        if not ua._allowed(address[0]):
            raise CallError("destination_not_allowed", f"{address[0]} is outside --sip-allow "
                            "(responses from it would be refused)", param="to", status=403)
        try:
            flow = await ua.transports.flow_to(transport, address)
        except (OSError, ConnectionError, asyncio.TimeoutError) as exc:
            raise CallError("destination_unreachable", f"cannot reach {address[0]}:"
                            f"{address[1]} over {transport}: {exc}", status=502) from None
        prepared = await prepare_config(agent.plugin, placement.session)
        admission = contextlib.ExitStack()
        try:
            admission.enter_context(agent.admit())
            rtp = await bind_rtp_port(ua.rtp)
        except BaseException:
            admission.close()
            agent.plugin.discard_runtime_config(prepared.runtime_config)
            raise
        host = ua.config.advertised_host
        trunk = placement.trunk
        from_value = placement.from_value or (
            f"<sip:{trunk.from_user}@{format_host(trunk.from_domain)}>" if trunk
            else f"<sip:agent@{format_host(host)}>")
        call = OutboundCall(
            api_id=f"sip_{tagged_token(ID_TOKEN_BYTES)}", owner=owner, placement=placement,
            flow=flow, sip_call_id=f"{secrets.token_hex(12)}@{format_host(host)}",
            local_tag=new_tag(), from_value=from_value, prepared=prepared, rtp=rtp,
            admission=admission)
        self.live[call.api_id] = call
        self._count("placed")
        ring = placement.ring_timeout or self.ring_timeout
        call.timers["ring"] = ua.timers.call_later(ring, lambda: self._ring_timeout(call))
        log.info("sip: outbound call %s to %s via %s:%d/%s", call.api_id,
                 printable(str(placement.target)), address[0], address[1], transport)
        self._send_invite(call, None)
        return call

    def _build_invite(self, call: OutboundCall, auth: tuple[str, str] | None) -> SipRequest:
        ua = self.ua
        host, transport = ua.config.advertised_host, call.flow.transport
        headers = Headers()
        headers.add("Via", f"SIP/2.0/{transport} {format_host(host)}:{ua.port};"
                    f"branch={new_branch()};rport")
        headers.add("Max-Forwards", "70")
        headers.add("From", f"{call.from_value};tag={call.local_tag}")
        headers.add("To", f"<{call.placement.target}>")
        headers.add("Call-ID", call.sip_call_id)
        headers.add("CSeq", f"{call.cseq} INVITE")
        headers.add("Contact", ua._contact(transport))
        headers.add("Allow", ALLOW)
        headers.add("User-Agent", SERVER_NAME)
        if auth is not None:
            headers.add(*auth)
        for name, value in call.placement.headers:
            headers.add(name, value)
        headers.add("Content-Type", "application/sdp")
        body = build_offer(ua._sdp_host(), call.rtp[2], int(call.created_at))
        return SipRequest(headers=headers, body=body, method="INVITE",
                          uri=str(call.placement.target))

    def _send_invite(self, call: OutboundCall, auth: tuple[str, str] | None) -> None:
        call.invite = self._build_invite(call, auth)
        call.provisional = False

        def on_response(response: SipResponse) -> None:
            try:
                self._on_response(call, response)
            except Exception:
                log.exception("sip: outbound call %s: handling %d failed", call.api_id,
                              response.status)
                self._end(call, EndReason.INTERNAL_ERROR)

        call.invite_tx = self.ua.transactions.new_client(
            call.invite, call.flow.send, call.flow.reliable, on_response,
            lambda: self._on_invite_timeout(call))

    # -- responses --------------------------------------------------------------------------

    def _on_response(self, call: OutboundCall, response: SipResponse) -> None:
        status = response.status
        if call.state == OutboundState.ENDED:
            if 200 <= status < 300:
                self.tasks.spawn(self._ack_and_bye(call, response), "late-2xx")
            return
        if status < 200:
            self._on_provisional(call, response)
        elif status < 300:
            if call.dialog is None:
                # The dialog is made here, at once: a retransmitted 2xx may follow at once.
                call.sip_status = status
                call.dialog = self._dialog_from(call, response)
                if call.dialog is None:
                    self.tasks.spawn(self._unusable_answer(call, response), "answer")
                else:
                    self.tasks.spawn(self._on_answer(call, response), "answer")
            elif response.to_addr.tag == call.dialog.remote_tag:
                self._resend_ack(call)  # a retransmitted 2xx
            else:  # another fork answered too: ACK and BYE it (§13.2.2.4)
                self.tasks.spawn(self._ack_and_bye(call, response), "other-fork")
        elif status in (401, 407) and not call.authenticated and call.cancel_reason is None:
            self._authenticate(call, response)
        else:
            reason = call.cancel_reason if status == 487 and call.cancel_reason else None
            call.sip_status = status
            self._end(call, reason or ending_for(status))

    def _on_provisional(self, call: OutboundCall, response: SipResponse) -> None:
        if response.status == 100:
            call.provisional = True
        else:
            first = not call.provisional or call.state == OutboundState.CALLING
            call.provisional = True
            if call.state == OutboundState.CALLING:
                call.state = OutboundState.RINGING
            if response.status == 183 and response.body:
                call.note("call.early_media", sip_status=183)
                if call.early is None and call.cancel_reason is None:
                    call.early_response = response
                    call.early = self.tasks.spawn(self._open_early(call, response), "early")
            elif first or response.status != 180:
                call.note("call.ringing", sip_status=response.status)
        if call.cancel_reason is not None and not call.cancel_sent:
            self._send_cancel(call)

    def _on_invite_timeout(self, call: OutboundCall) -> None:
        if call.state != OutboundState.ENDED:
            call.sip_status = 408
            self._end(call, call.cancel_reason or EndReason.TIMEOUT)

    def _authenticate(self, call: OutboundCall, response: SipResponse) -> None:
        proxy = response.status == 407
        values = response.headers.get_all("proxy-authenticate" if proxy else "www-authenticate")
        challenge = best_challenge(values)
        trunk = call.placement.trunk
        credentials = trunk.credentials_for(challenge.realm) if trunk and challenge else None
        header = (digest_answer(challenge, credentials, "INVITE", str(call.placement.target))
                  if challenge is not None and credentials is not None else None)
        call.sip_status = response.status
        if header is None:
            self._count("auth_failed")
            self._end(call, EndReason.AUTH_FAILED)
            return
        call.authenticated = True
        call.cseq += 1
        self._count("auth_answered")
        self._send_invite(call, ("Proxy-Authorization" if proxy else "Authorization", header))

    async def _unusable_answer(self, call: OutboundCall, response: SipResponse) -> None:
        """A 2xx without a usable Contact or Record-Route: no dialog can be made from it."""
        log.info("sip: outbound call %s: unusable 2xx (Contact/Record-Route)", call.api_id)
        self._end(call, EndReason.SETUP_FAILED)

    async def _on_answer(self, call: OutboundCall, response: SipResponse) -> None:
        try:
            await self._answered(call, response)
        except Exception:
            log.exception("sip: outbound call %s: taking the answer failed", call.api_id)
            if call.state != OutboundState.ENDED:
                await self._bye(call, EndReason.SETUP_FAILED)

    async def _answered(self, call: OutboundCall, response: SipResponse) -> None:
        dialog = call.dialog
        assert dialog is not None

        def hook(request: SipRequest, tx: ServerTransaction) -> bool:
            return self._on_dialog_request(call, request, tx)

        call.hook = hook
        self.ua.dialog_hooks.add(dialog.id, hook)
        self.ua.dialog_sources.add(
            dialog.id, lambda: outbound_dialog_sources(call.flow.remote[0], dialog))
        await self._send_ack(call)
        if call.state == OutboundState.ENDED:
            return
        if call.cancel_reason is not None:  # hung up while the 2xx was on its way
            await self._bye(call, call.cancel_reason)
            return
        if call.early is not None:
            with contextlib.suppress(Exception):
                await call.early  # the early leg is opened (or failed) before the answer
        if call.is_ended:  # it ended meanwhile
            return
        error = (await self._open_media(call, response) if call.leg is None
                 else self._answer_early_leg(call, response))
        if error is not None:
            log.info("sip: outbound call %s answered but unusable: %s", call.api_id, error)
            await self._bye(call, error)
            return
        call.state = OutboundState.ANSWERED
        call.answered_at = time.time()
        self._stop_timer(call, "ring")
        self._count("answered")
        call.note("call.answered", sip_status=response.status)
        log.info("sip: outbound call %s answered (%s, remote %s)", call.api_id,
                 call.leg.codec.name if call.leg else "?", call.leg.remote if call.leg else "?")

    def _dialog_from(self, call: OutboundCall, response: SipResponse) -> Dialog | None:
        """§12.1.2: the UAC's dialog from a 2xx."""
        contacts = response.headers.get_all("contact")
        contact = parse_name_addr(contacts[0]) if contacts else None
        routes = [parse_name_addr(value) for value in response.headers.get_all("record-route")]
        if contact is None or any(route is None for route in routes):
            return None
        assert call.invite is not None
        return Dialog(
            call_id=call.sip_call_id, local_tag=call.local_tag,
            remote_tag=response.to_addr.tag or "",
            local_party=call.invite.headers.get("from") or "",
            remote_party=response.headers.get("to") or "", remote_target=contact.uri,
            route_set=[route for route in reversed(routes) if route is not None],
            local_seq=call.cseq, transport=call.flow.transport)

    async def _ack_of(self, call: OutboundCall, dialog: Dialog) -> tuple[bytes, Flow] | None:
        """The ACK of a 2xx (§13.2.2.4: the INVITE's CSeq and credentials) and its flow."""
        assert call.invite is not None
        ua = self.ua
        dialog.local_seq = call.cseq - 1
        ack, hop = dialog.request("ACK", ua.config.advertised_host, ua.port,
                                  call.flow.transport)
        for name in ("authorization", "proxy-authorization"):
            for value in call.invite.headers.get_all(name):
                ack.headers.add(name, value)
        flow = await ua.flow_for(call.flow, hop, call.sip_call_id)
        return (ack.to_bytes(), flow) if flow is not None else None

    async def _send_ack(self, call: OutboundCall) -> None:
        assert call.dialog is not None
        call.ack = await self._ack_of(call, call.dialog)
        if call.ack is None:
            self._end(call, EndReason.UNREACHABLE)
            return
        self._resend_ack(call)

    def _resend_ack(self, call: OutboundCall) -> None:
        if call.ack is None:
            return
        data, flow = call.ack
        try:
            flow.send(data)
        except (OSError, ConnectionError) as exc:
            log.info("sip: outbound call %s: ACK not sent: %r", call.api_id, exc)

    async def _ack_and_bye(self, call: OutboundCall, response: SipResponse) -> None:
        """A 2xx the call cannot use (it ended, or the answer is unusable): ACK and BYE it
        (§13.2.2.4), without reopening the call."""
        if call.dialog is not None and response.to_addr.tag == call.dialog.remote_tag:
            self._resend_ack(call)
            return
        dialog = self._dialog_from(call, response)
        if dialog is None:
            return
        ack = await self._ack_of(call, dialog)
        if ack is not None:
            ack[1].send(ack[0])
            await self._send_bye(call, EndReason.ENDED, dialog)

    async def _open_early(self, call: OutboundCall, response: SipResponse) -> None:
        """Early media: the leg opens on the 183's SDP, listening only until the answer."""
        error = await self._open_media(call, response, early=True)
        if error is not None:
            log.info("sip: outbound call %s: early media not taken (%s)", call.api_id, error)
        elif call.leg is not None:
            log.info("sip: outbound call %s: early media from %s", call.api_id,
                     call.leg.remote)

    @staticmethod
    def _answer_choice(response: SipResponse | SipRequest,
                       codecs: tuple[str, ...] | None = None) -> AudioChoice | Ending:
        if response.content_type != "application/sdp" or not response.body:
            return EndReason.NO_SDP_ANSWER
        answer = parse_sdp(response.body)
        if isinstance(answer, SdpError):
            return coded(answer.code)
        choice = choose_audio(answer) if codecs is None else choose_audio(answer, codecs)
        return coded(choice.code) if isinstance(choice, SdpError) else choice

    def _answer_early_leg(self, call: OutboundCall, response: SipResponse) -> Ending | None:
        """The 2xx of a call whose leg early media opened: its SDP (else the 183's) sets the
        leg's direction and remote on the same codec; then the agent sends."""
        leg = call.leg
        assert leg is not None
        source = response if response.body else call.early_response
        choice = (self._answer_choice(source, (leg.codec.name,)) if source is not None
                  else EndReason.NO_SDP_ANSWER)
        if isinstance(choice, str):
            return choice
        try:
            if choice.remote is not None:
                check_remote(choice.remote[0], self.ua.rtp)
        except AgentError as exc:
            return coded(exc.code)
        leg.apply(choice, choice.answer_direction)
        leg.vouch(call.flow.remote[0])
        leg.start_watchdog()
        return None

    async def _open_media(self, call: OutboundCall, response: SipResponse,
                          early: bool = False) -> Ending | None:
        """The RTP leg on the answer's codec and address; the reason it failed, else None.
        `early`: on a 183's SDP, the agent listening only (no watchdog yet)."""
        ua, agent = self.ua, self.ua.agent
        choice = self._answer_choice(response)
        if isinstance(choice, str):
            return choice
        try:
            if choice.remote is not None:
                check_remote(choice.remote[0], ua.rtp)
            transport, protocol, port = call.rtp
            with call.admission:
                leg = SipRtpLeg(agent, choice.codec, transport, (ua.rtp.local_host, port),
                                choice.remote, ua.rtp,
                                dtmf_payload_type=choice.dtmf_payload_type,
                                leg_id=call.api_id)
            wire_sip_leg(leg, protocol, choice, owner=call.owner,
                         sip_call_id=call.sip_call_id, media_timeout=ua.config.media_timeout)
            leg.vouch(call.flow.remote[0])  # media on the host the agent dialed
            if early:
                leg.agent_sends = False
            call.leg = leg
            call.slot_opened = True  # the leg owns the prepared config from here on
            await leg.open_plugin_slot(call.prepared)
        except AgentError as exc:
            failed, call.leg = call.leg, None
            if failed is not None:
                await failed.close(EndReason.SETUP_FAILED)
            return coded(exc.code)
        if call.state == OutboundState.ENDED or call.cancel_reason is not None:
            call.leg = None
            await leg.close(EndReason.HANGUP)
            return call.cancel_reason or EndReason.ENDED
        self._by_leg[leg.id] = call
        leg.on_closed = self._on_leg_closed
        if not early:
            leg.start_watchdog()
        leg.start_sending()
        return None

    # -- ending -----------------------------------------------------------------------------

    def _ring_timeout(self, call: OutboundCall) -> None:
        call.timers.pop("ring", None)
        if call.state in (OutboundState.CALLING, OutboundState.RINGING):
            self._count("no_answer")
            self.cancel(call, EndReason.NO_ANSWER)

    def cancel(self, call: OutboundCall, reason: Ending) -> None:
        """Stop a call that is not answered yet: CANCEL once a provisional came (§9.1)."""
        if (call.state not in (OutboundState.CALLING, OutboundState.RINGING)
                or call.cancel_reason is not None):
            return
        call.cancel_reason = reason
        if call.provisional:
            self._send_cancel(call)

    def _send_cancel(self, call: OutboundCall) -> None:
        invite = call.invite
        assert invite is not None
        call.cancel_sent = True
        headers = Headers()
        headers.add("Via", invite.headers.get_all("via")[0])
        for route in invite.headers.lines("route"):
            headers.add("Route", route)
        headers.add("Max-Forwards", "70")
        for name in ("from", "to", "call-id"):
            headers.add(name, invite.headers.get(name) or "")
        headers.add("CSeq", f"{call.cseq} CANCEL")
        cancel = SipRequest(headers=headers, method="CANCEL", uri=invite.uri)
        self.ua.transactions.new_client(cancel, call.flow.send, call.flow.reliable,
                                        lambda response: None, lambda: None)
        # §9.1: no final answer to the INVITE within 64*T1 of the CANCEL: it is over.
        call.timers["cancel"] = self.ua.timers.call_later(
            self.ua.config.timers.timeout, lambda: self._cancel_unanswered(call))

    def _cancel_unanswered(self, call: OutboundCall) -> None:
        call.timers.pop("cancel", None)
        if call.state != OutboundState.ENDED:
            if call.invite_tx is not None:
                call.invite_tx.terminate()
            self._end(call, call.cancel_reason or EndReason.TIMEOUT)

    async def hang_up(self, call: OutboundCall,
                      reason: Ending = EndReason.HANGUP) -> None:
        """End the call from this side: CANCEL before the answer, BYE after it."""
        if call.state in (OutboundState.CALLING, OutboundState.RINGING):
            self.cancel(call, reason)
        elif call.state == OutboundState.ANSWERED and call.leg is not None:
            await call.leg.close(reason)  # _on_leg_closed sends the BYE

    def _on_leg_closed(self, leg: SipRtpLeg, reason: Ending) -> None:
        call = self._by_leg.pop(leg.id, None)
        if call is None or call.state == OutboundState.ENDED:
            return
        call.leg = None
        # An early-media leg ended: so does the call.
        if call.state in (OutboundState.CALLING, OutboundState.RINGING):
            self.cancel(call, reason)
            return
        self.tasks.spawn(self._bye(call, reason), "bye")

    async def _bye(self, call: OutboundCall, reason: Ending) -> None:
        try:
            await self._send_bye(call, reason)
        finally:
            self._end(call, reason)

    async def _send_bye(self, call: OutboundCall, reason: Ending,
                        dialog: Dialog | None = None) -> None:
        dialog = dialog or call.dialog
        if dialog is None:
            return
        ua = self.ua
        request, hop = dialog.request("BYE", ua.config.advertised_host, ua.port,
                                      call.flow.transport)
        request.headers.add("Reason", f'SIP;cause=200;text="{reason}"')
        flow = await ua.flow_for(call.flow, hop, call.sip_call_id)
        if flow is None:
            return
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def settle(status: int) -> None:
            if not done.done():
                done.set_result(status)

        ua.transactions.new_client(
            request, flow.send, flow.reliable,
            lambda response: settle(response.status) if response.status >= 200 else None,
            lambda: settle(408))
        status = await done
        log.info("sip: outbound call %s ended (%s); BYE answered %d", call.api_id, reason,
                 status)

    def _on_dialog_request(self, call: OutboundCall, request: SipRequest,
                           tx: ServerTransaction) -> bool:
        """Requests of the far end in an outbound call's dialog (BYE, OPTIONS, re-INVITE,
        UPDATE); others go on to the core (REFER: 405)."""
        dialog = call.dialog
        assert dialog is not None
        respond = self.ua._response
        if request.method in ("BYE", "INVITE", "OPTIONS", "UPDATE"):
            if request.cseq.number < dialog.remote_seq:
                tx.respond(respond(request, 500, reason="CSeq Out of Order"))
                return True
            dialog.remote_seq = request.cseq.number
        if request.method == "BYE":
            tx.respond(respond(request, 200))
            self._count("remote_hangups")
            leg, call.leg = call.leg, None
            if leg is not None:
                self._by_leg.pop(leg.id, None)
                leg.on_closed = None
                self.tasks.spawn(leg.close(EndReason.REMOTE_HANGUP), "leg-close")
            self._end(call, EndReason.REMOTE_HANGUP)
            return True
        if request.method == "OPTIONS":
            tx.respond(respond(request, 200, headers=[("Allow", ALLOW)]))
            return True
        if request.method in ("INVITE", "UPDATE"):
            self._on_offer(call, request, tx)
            return True
        return False

    # -- offers from the far end (hold, resume, a moved address) ----------------------------

    def _on_offer(self, call: OutboundCall, request: SipRequest,
                  tx: ServerTransaction) -> None:
        """A re-INVITE or UPDATE: its offer applied to the leg on the call's codec and
        answered; 491 while the call is not up or our 2xx of the last one is not ACKed."""
        ua, dialog, leg = self.ua, call.dialog, call.leg
        assert dialog is not None
        respond = ua._response
        invite = request.method == "INVITE"
        if leg is None or call.state != OutboundState.ANSWERED or call.ack_cseq is not None:
            tx.respond(respond(request, 491))
            return
        headers = [("Contact", ua._contact(call.flow.transport)), ("Allow", ALLOW)]
        if not request.body:  # a target refresh; an offerless re-INVITE gets our offer
            dialog.refresh_target(request)
            if not invite:
                tx.respond(respond(request, 200, headers=headers))
                return
            call.sdp_version += 1
            assert leg.codec.payload_type is not None
            offer = build_offer(ua._sdp_host(), call.rtp[2], int(call.created_at),
                                call.sdp_version, (leg.codec.payload_type, leg.codec.encoding))
            call.awaiting_answer = True
            self._count("reinvites")
            self._send_ok(call, tx, respond(request, 200, body=offer, headers=headers))
            return
        problem = ua._offer_problem(request, (leg.codec.name,), dialog.local_tag)
        if isinstance(problem, SipResponse):
            self._count("reoffers_refused")
            tx.respond(problem)  # the call goes on as it was
            return
        offer_sdp, choice, secured = problem
        if secured is not None:
            tx.respond(respond(request, 488, headers=[
                ("Warning", f'399 {SERVER_NAME} "SRTP is not served on outbound calls"')]))
            return
        leg.apply(choice, choice.answer_direction)
        dialog.refresh_target(request)
        call.sdp_version += 1
        answer = build_answer(offer_sdp, choice, ua._sdp_host(), call.rtp[2],
                              int(call.created_at), call.sdp_version)
        call.note("call.media_updated", method=request.method,
                  direction=choice.answer_direction)
        log.info("sip: outbound call %s %s: %s, remote %s", call.api_id, request.method,
                 choice.answer_direction, choice.remote)
        ok = respond(request, 200, body=answer, headers=headers)
        if invite:
            self._count("reinvites")
            self._send_ok(call, tx, ok)
        else:
            self._count("updates")
            tx.respond(ok)

    def _send_ok(self, call: OutboundCall, tx: ServerTransaction, ok: SipResponse) -> None:
        """A re-INVITE's 2xx, retransmitted (T1 doubling to T2) until its ACK (§13.3.1.4)."""
        assert isinstance(tx, InviteServerTransaction) and call.dialog is not None
        call.ack_cseq = tx.request.cseq.number
        tx.respond(ok)
        settings = self.ua.config.timers
        if not call.flow.reliable:
            retransmit_2xx(self.ua.timers, settings, tx.send, ok.to_bytes(),
                           lambda: (call.ack_cseq is not None
                                    and call.state == OutboundState.ANSWERED),
                           call.timers)
        call.timers["no_ack"] = self.ua.timers.call_later(settings.timeout,
                                                          lambda: self._no_ack(call))
        self.ua.dialog_hooks.set_ack(call.dialog.id, lambda ack: self._on_ack(call, ack))

    def _on_ack(self, call: OutboundCall, ack: SipRequest) -> bool:
        if call.ack_cseq is None or ack.cseq.number != call.ack_cseq:
            return False
        call.ack_cseq = None
        self._stop_timer(call, "2xx")
        self._stop_timer(call, "no_ack")
        if call.dialog is not None:
            self.ua.dialog_hooks.set_ack(call.dialog.id, None)
        if call.awaiting_answer:
            call.awaiting_answer = False
            self._take_answer(call, ack)
        return True

    def _take_answer(self, call: OutboundCall, ack: SipRequest) -> None:
        """The answer to our offer in a re-INVITE's 2xx, in its ACK; none keeps the call as
        it was, an unusable one ends it (§13.3.1.4)."""
        leg = call.leg
        if leg is None or not ack.body:
            return
        choice = self._answer_choice(ack, (leg.codec.name,))
        if not isinstance(choice, str) and choice.remote is not None:
            try:
                check_remote(choice.remote[0], self.ua.rtp)
            except AgentError as exc:
                choice = coded(exc.code)
        if isinstance(choice, str):
            log.info("sip: outbound call %s: unusable answer in the ACK (%s)", call.api_id,
                     choice)
            self.tasks.spawn(self.hang_up(call, EndReason.BAD_ANSWER), "bad-answer")
            return
        leg.apply(choice, choice.answer_direction)
        call.note("call.media_updated", method="ACK", direction=choice.answer_direction)

    def _no_ack(self, call: OutboundCall) -> None:
        call.timers.pop("no_ack", None)
        if call.ack_cseq is None or call.state != OutboundState.ANSWERED:
            return
        log.info("sip: outbound call %s: no ACK for the 2xx of its re-INVITE; ending it",
                 call.api_id)
        call.ack_cseq = None
        self._stop_timer(call, "2xx")
        self.tasks.spawn(self.hang_up(call, EndReason.NO_ACK), "no-ack")

    def _stop_timer(self, call: OutboundCall, name: str) -> None:
        handle = call.timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _end(self, call: OutboundCall, reason: Ending) -> None:
        if call.state == OutboundState.ENDED:
            return
        previous = call.state
        call.state = OutboundState.ENDED
        call.reason = reason
        call.ended_at = time.time()
        for handle in call.timers.values():
            handle.cancel()
        call.timers.clear()
        if call.dialog is not None and call.hook is not None:
            self.ua.dialog_hooks.remove(call.dialog.id, call.hook)
            call.hook = None
        if call.dialog is not None:
            self.ua.dialog_hooks.set_ack(call.dialog.id, None)
            self.ua.dialog_sources.remove(call.dialog.id)
        call.admission.close()
        if not call.slot_opened:
            self.ua.agent.plugin.discard_runtime_config(call.prepared.runtime_config)
            call.slot_opened = True
        if call.leg is None:
            transport = call.rtp[0]
            if not transport.is_closing():
                transport.close()
        else:
            leg, call.leg = call.leg, None
            self._by_leg.pop(leg.id, None)
            leg.on_closed = None
            self.tasks.spawn(leg.close(reason), "leg-close")
        self._count("ended_" + reason)
        call.note("call.ended", reason=reason, sip_status=call.sip_status)
        log.info("sip: outbound call %s ended %s (was %s, SIP status %s)", call.api_id, reason,
                 previous, call.sip_status)
        self.live.pop(call.api_id, None)
        self.ended[call.api_id] = call
        while len(self.ended) > RETAINED_ENDED:
            self.ended.popitem(last=False)

    async def close(self, grace: float = 2.0) -> None:
        """Stop every call (CANCEL or BYE), give them `grace` seconds, then end the rest."""
        for call in list(self.live.values()):
            await self.hang_up(call, EndReason.SHUTDOWN)
        deadline = time.monotonic() + grace
        while self.live and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for call in list(self.live.values()):
            self._end(call, EndReason.SHUTDOWN)
        cancelled = self.tasks.cancel_all()
        if cancelled:
            await asyncio.gather(*cancelled, return_exceptions=True)
