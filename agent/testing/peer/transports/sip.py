"""The SIP transport of the headless peer: a small UAC dialling `sip:USER@HOST:PORT` over UDP,
with SDP (PCMU/PCMA, RFC 4733 telephone-event) and the RTP stream of rtp_stream.py.

Why a UAC of its own rather than the agent's SIP code: the peer is a client of the public
protocols only, and agent/ may not import signaling/ (import-linter), where the agent's SIP
stack (a server: UAS transactions, dialogs, guard) lives. A caller needs little of SIP: one
INVITE client transaction (retransmitted on RFC 3261's timer A until a response, given up
after timer B), the ACK, a BYE client transaction, and answers to the requests a server may
send inside the dialog (BYE ends the call, OPTIONS and re-INVITE get 200). No Python SIP
library on PyPI is kept up to date for asyncio, and these few messages are plain text; the
format follows RFC 3261 sections 7, 8.1, 12 and 17.1, the offer RFC 3264.

A call the far end refuses fails with `refused` and the status line (`SIP 486 Busy Here`);
no answer within `timeout` fails with `timeout`. The signalling socket is connected to the
server's address, so an ICMP port unreachable (nothing listening there: an agent started
without `--sip-listen`) reaches the peer, which fails at once with `connect_failed` and says
so; one that sends nothing at all (a firewall that drops) is named as such after 5 s. `send_dtmf`
needs telephone-event in the answer. Server events come from the sideband only when the
agent's call id is given (`extra["sideband_call_id"]`): SIP does not name it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import secrets
import socket
from dataclasses import dataclass, field
from typing import Any

from agent.testing.peer.transports.base import (
    BAD_URL,
    CLOSED,
    CONNECT_FAILED,
    REFUSED,
    TIMEOUT,
    UNSUPPORTED,
    PeerCall,
    PeerError,
    PeerOptions,
)
from agent.testing.peer.transports.narrowband import PAYLOAD_TYPES, codec_name
from agent.testing.peer.transports.rtp import bind_host_for
from agent.testing.peer.transports.rtp_stream import Address, RtpStream
from agent.testing.peer.transports.sideband import Sideband
from agent.testing.peer.transports.telephone_events import DEFAULT_PAYLOAD_TYPE
from agent.testing.peer.transports.urls import SIP_URI, url_problem

T1 = 0.5  # RFC 3261 timer T1 (seconds)
MAX_RETRANSMIT = 4.0  # T2
# A SIP server answers an INVITE with 100 Trying at once (RFC 3261 17.2.1: within 200 ms);
# nothing at all heard in this long (the INVITE sent 4 times) means none is there.
NOTHING_HEARD_S = 5.0
URI = SIP_URI


@dataclass
class SipUri:
    user: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> SipUri:
        problem = url_problem(text, "sip")
        match = URI.match(text.strip())
        if problem is not None or match is None:
            raise PeerError(BAD_URL, problem or f"{text}: the sip transport dials "
                            "sip:USER@HOST[:PORT]")
        params = (match.group("params") or "").lower()
        if "transport=" in params and "transport=udp" not in params:
            raise PeerError(UNSUPPORTED, f"{text}: the peer's SIP speaks UDP only")
        return cls(match.group("user") or "agent", match.group("host").strip("[]"),
                   int(match.group("port") or 5060))

    def __str__(self) -> str:
        return f"sip:{self.user}@{self.host}:{self.port}"


@dataclass
class SipMessage:
    """A parsed SIP message: the start line's parts, headers (lower-case names), body."""

    first: list[str]
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_response(self) -> bool:
        return self.first[0].startswith("SIP/")

    @property
    def status(self) -> int:
        return int(self.first[1]) if self.is_response else 0

    @property
    def reason(self) -> str:
        return " ".join(self.first[2:]) if self.is_response else ""

    @property
    def method(self) -> str:
        return self.cseq[1] if self.is_response else self.first[0]

    def get(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key == name]

    @property
    def cseq(self) -> tuple[int, str]:
        number, _, method = (self.get("cseq") or "0 X").partition(" ")
        return int(number), method.strip()


COMPACT = {"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact", "l":
           "content-length", "c": "content-type"}


def parse_message(data: bytes) -> SipMessage | None:
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        lines = head.decode("utf-8").split("\r\n")
    except UnicodeDecodeError:
        return None
    first = lines[0].split(" ")
    if len(first) < 3:
        return None
    message = SipMessage(first)
    for line in lines[1:]:
        if line[:1] in (" ", "\t") and message.headers:  # folded continuation
            name, value = message.headers[-1]
            message.headers[-1] = (name, value + " " + line.strip())
            continue
        name, colon, value = line.partition(":")
        if not colon:
            continue
        key = name.strip().lower()
        message.headers.append((COMPACT.get(key, key), value.strip()))
    length = message.get("content-length")
    message.body = body[: int(length)] if length and length.isdigit() else body
    return message


def tag_of(header: str | None) -> str | None:
    match = re.search(r";\s*tag=([^;>\s]+)", header or "")
    return match.group(1) if match else None


def uri_in(header: str) -> str:
    match = re.search(r"<([^>]+)>", header)
    return match.group(1) if match else header.split(";")[0].strip()


@dataclass
class Answer:
    address: Address
    payload_type: int
    dtmf_payload_type: int | None


def sdp_offer(host: str, port: int, codec: str, dtmf: int) -> str:
    pt = PAYLOAD_TYPES[codec]
    session = secrets.randbelow(1 << 31)
    return "\r\n".join([
        "v=0", f"o=peer {session} {session} IN IP4 {host}", "s=peer", f"c=IN IP4 {host}",
        "t=0 0", f"m=audio {port} RTP/AVP {pt} {dtmf}", f"a=rtpmap:{pt} {codec}/8000",
        f"a=rtpmap:{dtmf} telephone-event/8000", f"a=fmtp:{dtmf} 0-16", "a=ptime:20",
        "a=sendrecv", "",
    ])


def parse_answer(sdp: str, offered: int) -> Answer:
    """Where to send (c=, m=audio port) and the payload types the answer kept."""
    host = None
    port = None
    formats: list[int] = []
    dtmf = None
    for raw in sdp.splitlines():
        line = raw.strip()
        if line.startswith("c=") and (host is None or port is None):
            host = line.split()[-1]
        elif line.startswith("m=audio"):
            parts = line.split()
            port = int(parts[1])
            formats = [int(p) for p in parts[3:] if p.isdigit()]
        elif line.startswith("a=rtpmap:") and "telephone-event" in line.lower():
            dtmf = int(line[9:].split()[0])
    if host is None or port is None or not port:
        raise PeerError(REFUSED, "the SDP answer has no audio address (c= and m=audio)")
    if offered not in formats:
        raise PeerError(REFUSED, f"the SDP answer dropped payload type {offered}")
    return Answer((host, port), offered, dtmf if dtmf in formats else None)


class _SipSocket(asyncio.DatagramProtocol):
    def __init__(self, call: SipCall) -> None:
        self.call = call

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        self.call.on_datagram(data, (addr[0], addr[1]))

    def error_received(self, exc: Exception) -> None:
        if isinstance(exc, ConnectionRefusedError):  # ICMP port unreachable
            self.call.on_unreachable()


class SipCall(PeerCall):
    transport = "sip"

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        super().__init__(url, options)
        self.stream: RtpStream | None = None
        self._socket: asyncio.DatagramTransport | None = None
        self._server: Address | None = None
        self._local: Address | None = None
        self.sip_call_id = secrets.token_hex(10)
        self._from_tag = secrets.token_hex(5)
        self._to_tag: str | None = None
        self._remote_target: str | None = None
        self._cseq = 1
        self._responses: asyncio.Queue[SipMessage | None] = asyncio.Queue()  # None: ICMP
        self._heard = False  # anything at all came from the server
        self._answered = False
        self.final_status: int | None = None
        self._offer = ""

    # -- messages ---------------------------------------------------------------------------

    def _request(self, method: str, uri: str, cseq: int, branch: str,
                 body: str = "", content_type: str = "application/sdp") -> bytes:
        assert self._local is not None
        host, port = self._local
        target = SipUri.parse(self.url)
        to = f"<{target}>" + (f";tag={self._to_tag}" if self._to_tag else "")
        lines = [
            f"{method} {uri} SIP/2.0",
            f"Via: SIP/2.0/UDP {host}:{port};branch={branch};rport",
            "Max-Forwards: 70",
            f"From: <sip:peer@{host}:{port}>;tag={self._from_tag}",
            f"To: {to}",
            f"Call-ID: {self.sip_call_id}",
            f"CSeq: {cseq} {method}",
            f"Contact: <sip:peer@{host}:{port}>",
            "User-Agent: duplex-agent-peer",
        ]
        if body:
            lines.append(f"Content-Type: {content_type}")
        lines.append(f"Content-Length: {len(body.encode())}")
        return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()

    def _response_to(self, request: SipMessage, status: int, reason: str,
                     body: str = "") -> bytes:
        lines = [f"SIP/2.0 {status} {reason}"]
        lines += [f"Via: {via}" for via in request.all("via")]
        lines += [f"From: {request.get('from')}", f"To: {request.get('to')}",
                  f"Call-ID: {request.get('call-id')}", f"CSeq: {request.get('cseq')}"]
        if body:
            lines.append("Content-Type: application/sdp")
        lines.append(f"Content-Length: {len(body.encode())}")
        return ("\r\n".join(lines) + "\r\n\r\n" + body).encode()

    def _send(self, data: bytes) -> None:
        if self._socket is not None:
            self._socket.sendto(data)  # connected to the server

    def _nothing_there(self) -> str:
        assert self._server is not None
        host, port = self._server
        return (f"nothing answered SIP at {host}:{port} — is the server running with "
                "--sip-listen?")

    def on_unreachable(self) -> None:
        if not self._heard:
            self._responses.put_nowait(None)

    def on_datagram(self, data: bytes, source: Address) -> None:
        self._heard = True
        message = parse_message(data)
        if message is None or message.get("call-id") != self.sip_call_id:
            return
        if message.is_response:
            self._responses.put_nowait(message)
            return
        method = message.first[0]
        if method == "BYE":
            self._send(self._response_to(message, 200, "OK"))
            self.add_event({"type": "sip.bye", "from": "remote"})
            self.mark_ended("remote_hangup")
        elif method == "INVITE":  # a re-INVITE (session refresh, hold): keep our offer
            self._send(self._response_to(message, 200, "OK", self._offer))
        elif method in ("OPTIONS", "INFO", "UPDATE", "NOTIFY"):
            self._send(self._response_to(message, 200, "OK"))
        elif method != "ACK":
            self._send(self._response_to(message, 501, "Not Implemented"))

    async def _transaction(self, request: bytes, method: str, cseq: int,
                           timeout: float) -> SipMessage:
        """Send (retransmitting on timer A/E) until a final response to (cseq, method); the
        provisional ones become events."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        silent_deadline = loop.time() + min(timeout, NOTHING_HEARD_S)
        interval = T1
        next_send = loop.time()
        provisional = False
        while True:
            now = loop.time()
            if not self._heard and now >= silent_deadline:
                waited = min(timeout, NOTHING_HEARD_S)
                raise PeerError(TIMEOUT, f"no answer to {method} within {waited:g} s: "
                                + self._nothing_there())
            if now >= deadline:
                raise PeerError(TIMEOUT, f"no final answer to {method} within {timeout:g} s")
            if now >= next_send and not provisional:
                self._send(request)
                next_send = now + interval
                interval = min(interval * 2, MAX_RETRANSMIT)
            wait = min(deadline if self._heard else silent_deadline,
                       next_send if not provisional else deadline) - now
            try:
                response = await asyncio.wait_for(self._responses.get(), max(wait, 0.01))
            except asyncio.TimeoutError:
                continue
            if response is None:  # ICMP port unreachable: no SIP server at that address
                raise PeerError(CONNECT_FAILED, f"{self._nothing_there()} (port unreachable)")
            if response.cseq != (cseq, method):
                continue
            if response.status < 200:
                provisional = method == "INVITE"
                self.add_event({"type": "sip.provisional", "status": response.status,
                                "reason": response.reason})
                continue
            return response

    # -- the call ---------------------------------------------------------------------------

    async def connect(self) -> None:
        self.start_clock()
        target = SipUri.parse(self.url)
        try:
            codec = self.codec = codec_name(self.options.codec)
        except ValueError as exc:
            raise PeerError(UNSUPPORTED, str(exc)) from None
        try:
            server_ip = socket.gethostbyname(target.host)
        except OSError as exc:
            raise PeerError(BAD_URL, f"{target.host}: {exc}") from None
        bind = str(self.options.extra.get("rtp_bind") or bind_host_for(server_ip))
        self._server = (server_ip, target.port)
        loop = asyncio.get_running_loop()
        # Connected: the server's answers come from where they were sent (RFC 3261 18.2.2
        # with rport), and an ICMP port unreachable reaches this socket.
        self._socket, _ = await loop.create_datagram_endpoint(
            lambda: _SipSocket(self), local_addr=(bind, 0), remote_addr=self._server)
        local = self._socket.get_extra_info("sockname")
        advertised = bind if bind != "0.0.0.0" else self._advertised_address(server_ip)
        self._local = (advertised, local[1])
        dtmf = int(self.options.extra.get("dtmf_payload_type", DEFAULT_PAYLOAD_TYPE))
        self.stream = RtpStream(self, codec, dtmf)
        rtp_local = await self.stream.bind(bind)
        self._offer = sdp_offer(advertised, rtp_local[1], codec, dtmf)
        branch = "z9hG4bK" + secrets.token_hex(8)
        invite = self._request("INVITE", str(target), 1, branch, self._offer)
        response = await self._transaction(invite, "INVITE", 1, self.options.timeout)
        self.final_status = response.status
        if response.status >= 300:
            # The ACK of a non-2xx answer belongs to the INVITE transaction (same branch).
            self._to_tag = tag_of(response.get("to"))
            self._send(self._request("ACK", str(target), 1, branch))
            raise PeerError(REFUSED, f"SIP {response.status} {response.reason}")
        self._to_tag = tag_of(response.get("to"))
        contact = response.get("contact")
        self._remote_target = uri_in(contact) if contact else str(target)
        self._send(self._request("ACK", self._remote_target, 1,
                                 "z9hG4bK" + secrets.token_hex(8)))
        self._answered = True
        self.call_id = self.sip_call_id
        answer = parse_answer(response.body.decode("utf-8", "replace"),
                              PAYLOAD_TYPES[codec])
        self.stream.dtmf_payload_type = answer.dtmf_payload_type
        self.connected_at = self.now()
        self.stream.start(answer.address)
        sideband_id = self.options.extra.get("sideband_call_id")
        if sideband_id or self.options.sideband:
            saved, self.call_id = self.call_id, (str(sideband_id) if sideband_id else None)
            try:
                base = self.options.extra.get("sideband_url")
                self._sideband = await Sideband.open_if(self, self.headers, base)
            finally:
                self.call_id = saved

    @staticmethod
    def _advertised_address(server_ip: str) -> str:
        """The local address that routes to the server (a connected UDP socket's name)."""
        if ipaddress.ip_address(server_ip).is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((server_ip, 9))
            return str(probe.getsockname()[0])

    async def send_dtmf(self, digits: str) -> None:
        if self.stream is None or not self._answered:
            raise PeerError(CLOSED, "the call is not connected")
        if self.stream.dtmf_payload_type is None:
            raise PeerError(UNSUPPORTED, "the answer did not accept telephone-event")
        try:
            await self.stream.send_dtmf(digits)
        except ValueError as exc:
            raise PeerError("invalid_dtmf", str(exc)) from None

    async def end_remote(self, remote_ended: bool) -> None:
        if self._answered and not remote_ended and self._remote_target is not None:
            self._cseq += 1
            bye = self._request("BYE", self._remote_target, self._cseq,
                                "z9hG4bK" + secrets.token_hex(8))
            try:
                await self._transaction(bye, "BYE", self._cseq, min(self.options.timeout, 4.0))
            except PeerError:
                pass  # no answer to the BYE: the dialog is over on this side all the same

    async def close(self) -> None:
        if not await self.begin_close():
            return
        if self.stream is not None:
            await self.stream.close()
        if self._socket is not None:
            self._socket.close()
