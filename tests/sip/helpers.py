"""What the SIP tests share: a raw SIP peer on UDP/TCP, request builders, a call set up
(`establish`: INVITE, 200, ACK) and ended (`hang_up`: BYE, 200, the server quiet), an RTP
probe, a μ-law WAV writer, the sipp runner and the stop of a third-party program by its PID
(`missing`: skipped without the program, a failure under CI)."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from aiortc.rtp import RtpPacket

from agent.media_agent import MediaAgent
from agent.telephony.codec import PCMU
from signaling.sip.message import (
    Headers,
    ParseFailure,
    SipMessage,
    SipRequest,
    SipResponse,
    frame_stream,
    parse_message,
)
from signaling.sip.ua import UserAgent
from tests.support.agents import wait_until

HOST = "127.0.0.1"
Address = tuple[str, int]


@dataclass
class SipServer:
    agent: MediaAgent
    server: TestServer
    ua: UserAgent

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def sip(self) -> Address:
        return HOST, self.ua.port

    def sip_legs(self) -> int:
        return self.agent.legs.count_by_transport().get("sip", 0)

    def idle(self) -> bool:
        """No call, leg, plugin seat, transaction or task of the UA left."""
        stats = self.ua.stats()
        return (not self.agent.legs and not self.agent.ticker.slots and stats["calls"] == 0
                and stats["transactions"] == {"server": 0, "client": 0}
                and stats["tasks"] == 0)

    def quiet(self) -> bool:
        """No call, leg or task left (transactions may still absorb retransmissions)."""
        return (not self.agent.legs and not self.agent.ticker.slots
                and self.ua.stats()["calls"] == 0 and self.ua.stats()["tasks"] == 0)


SipServerFactory = Callable[..., Awaitable[SipServer]]


def free_udp_port() -> int:
    """A port free for UDP and TCP both (SIP binds both on it), picked below the kernel's
    ephemeral range, where the tests' own outgoing connections cannot take it meanwhile."""
    for _ in range(200):
        port = random.randint(20000, 32000)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
                    socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                udp.bind((HOST, port))
                tcp.bind((HOST, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port for SIP between 20000 and 32000")


# -- a raw SIP peer --------------------------------------------------------------------------


class SipPeer(asyncio.DatagramProtocol):
    """A UDP socket speaking SIP by hand: what it receives, parsed, in a queue."""

    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.inbox: asyncio.Queue[SipMessage | ParseFailure] = asyncio.Queue()
        self.log: list[SipMessage | ParseFailure] = []
        self.datagrams: list[bytes] = []  # as received, for answers our parser would refuse

    @classmethod
    async def open(cls) -> SipPeer:
        loop = asyncio.get_running_loop()
        _, peer = await loop.create_datagram_endpoint(cls, local_addr=(HOST, 0))
        return peer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.datagrams.append(data)
        message = parse_message(data)
        self.log.append(message)
        self.inbox.put_nowait(message)

    def send(self, data: bytes | SipMessage, to: Address) -> None:
        assert self.transport is not None
        self.transport.sendto(data.to_bytes() if isinstance(data, SipMessage) else data, to)

    async def next(self, timeout: float = 5.0) -> SipMessage | ParseFailure:
        return await asyncio.wait_for(self.inbox.get(), timeout)

    async def response(self, status: int | None = None, timeout: float = 5.0,
                       method: str | None = None) -> SipResponse:
        """The next response (with this status and CSeq method, if given); others skipped."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            message = await self.next(max(0.01, deadline - loop.time()))
            if not isinstance(message, SipResponse):
                continue
            if status is not None and message.status != status:
                continue
            if method is not None and message.cseq.method != method:
                continue
            return message

    async def request(self, method: str, timeout: float = 5.0) -> SipRequest:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            message = await self.next(max(0.01, deadline - loop.time()))
            if isinstance(message, SipRequest) and message.method == method:
                return message

    async def drain(self, seconds: float) -> list[SipMessage | ParseFailure]:
        """Whatever arrives within `seconds`."""
        got: list[SipMessage | ParseFailure] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (left := deadline - loop.time()) > 0:
            try:
                got.append(await asyncio.wait_for(self.inbox.get(), left))
            except asyncio.TimeoutError:
                break
        return got

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class TcpSipPeer:
    """A TCP connection speaking SIP by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = bytearray()

    @classmethod
    async def connect(cls, to: Address) -> TcpSipPeer:
        reader, writer = await asyncio.open_connection(*to)
        return cls(reader, writer)

    @property
    def port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    def send(self, data: bytes | SipMessage) -> None:
        self.writer.write(data.to_bytes() if isinstance(data, SipMessage) else data)

    async def next(self, timeout: float = 5.0) -> SipMessage | ParseFailure | None:
        """The next message, or None when the server closed the connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            frame = frame_stream(self.buffer)
            if frame is not None and not isinstance(frame, ParseFailure) and frame.data:
                del self.buffer[: frame.consumed]
                return parse_message(frame.data, stream=True)
            if frame is not None and not isinstance(frame, ParseFailure):
                del self.buffer[: frame.consumed]
                continue
            try:
                data = await asyncio.wait_for(self.reader.read(65536),
                                              max(0.01, deadline - loop.time()))
            except ConnectionResetError:
                return None  # closed while we were still sending
            if not data:
                return None
            self.buffer.extend(data)

    async def until_final(self) -> tuple[list[int], SipResponse]:
        """The responses read up to a final one: every status seen, and that final answer."""
        statuses = []
        while True:
            message = await self.next()
            assert isinstance(message, SipResponse), message
            statuses.append(message.status)
            if message.status >= 200:
                return statuses, message

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


# -- building requests -------------------------------------------------------------------------


def sdp_offer(port: int, formats: str = "0 101", direction: str | None = None,
              ip: str = HOST, proto: str = "RTP/AVP", extra_media: str = "") -> bytes:
    lines = ["v=0", f"o=peer 1 1 IN IP4 {ip}", "s=-", f"c=IN IP4 {ip}", "t=0 0"]
    lines.append(f"m=audio {port} {proto} {formats}")
    if "0" in formats.split():
        lines.append("a=rtpmap:0 PCMU/8000")
    if "8" in formats.split():
        lines.append("a=rtpmap:8 PCMA/8000")
    if "101" in formats.split():
        lines += ["a=rtpmap:101 telephone-event/8000", "a=fmtp:101 0-16"]
    if direction:
        lines.append(f"a={direction}")
    if extra_media:
        lines.append(extra_media)
    return ("\r\n".join(lines) + "\r\n").encode()


@dataclass
class Dialogue:
    """One call as a hand-made UAC sees it: ids, tags, CSeq and its peer's address."""

    peer_port: int
    server: Address
    transport: str = "UDP"
    call_id: str = field(default_factory=lambda: secrets.token_hex(8) + "@test")
    from_tag: str = field(default_factory=lambda: secrets.token_hex(4))
    to_tag: str | None = None
    cseq: int = 1

    def request(self, method: str, *, body: bytes = b"", branch: str | None = None,
                cseq: int | None = None, to_tag: str | None = None,
                headers: list[tuple[str, str]] | None = None,
                content_type: str = "application/sdp") -> SipRequest:
        host, port = self.server
        branch = branch or "z9hG4bK" + secrets.token_hex(6)
        out = Headers()
        out.add("Via", f"SIP/2.0/{self.transport} {HOST}:{self.peer_port};branch={branch}")
        out.add("Max-Forwards", "70")
        out.add("From", f"<sip:caller@{HOST}:{self.peer_port}>;tag={self.from_tag}")
        tag = to_tag if to_tag is not None else self.to_tag
        out.add("To", f"<sip:agent@{host}:{port}>" + (f";tag={tag}" if tag else ""))
        out.add("Call-ID", self.call_id)
        out.add("CSeq", f"{self.cseq if cseq is None else cseq} {method}")
        suffix = ";transport=tcp" if self.transport == "TCP" else ""
        out.add("Contact", f"<sip:caller@{HOST}:{self.peer_port}{suffix}>")
        for name, value in headers or []:
            out.add(name, value)
        if body:
            out.add("Content-Type", content_type)
        return SipRequest(headers=out, body=body, method=method, uri=f"sip:agent@{host}:{port}")

    def ack_for(self, invite: SipRequest, response: SipResponse) -> SipRequest:
        """The ACK of a 2xx: a new branch, the INVITE's CSeq number."""
        self.to_tag = response.to_addr.tag
        return self.request("ACK", cseq=invite.cseq.number)


async def establish(server: SipServer, peer: SipPeer, offer: bytes = b"", *,
                    headers: list[tuple[str, str]] | None = None,
                    ) -> tuple[Dialogue, SipRequest, SipResponse]:
    """A call from `peer` over UDP: INVITE carrying `offer`, its 200 awaited and ACKed."""
    dialogue = Dialogue(peer.port, server.sip)
    invite = dialogue.request("INVITE", body=offer, headers=headers)
    peer.send(invite, server.sip)
    ok = await peer.response(200)
    peer.send(dialogue.ack_for(invite, ok), server.sip)
    return dialogue, invite, ok


async def hang_up(server: SipServer, peer: SipPeer, dialogue: Dialogue,
                  *closing: SipPeer | RtpProbe) -> SipResponse:
    """The caller's BYE (next CSeq): its 200 awaited, then the server quiet again (no call,
    leg or task left); `peer` and `closing` are closed. The BYE's 200 is returned."""
    dialogue.cseq += 1
    peer.send(dialogue.request("BYE"), server.sip)
    ok = await peer.response(200, method="BYE")
    await wait_until(server.quiet)
    peer.close()
    for other in closing:
        other.close()
    return ok


# -- RTP -------------------------------------------------------------------------------------


class RtpProbe(asyncio.DatagramProtocol):
    """Where a caller's RTP port would be: keeps what the agent sends."""

    def __init__(self) -> None:
        self.packets: list[RtpPacket] = []
        self.sources: set[Address] = set()
        self.transport: asyncio.DatagramTransport | None = None

    @classmethod
    async def open(cls, port: int = 0) -> RtpProbe:
        loop = asyncio.get_running_loop()
        _, probe = await loop.create_datagram_endpoint(cls, local_addr=(HOST, port))
        return probe

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    @property
    def port(self) -> int:
        assert self.transport is not None
        return int(self.transport.get_extra_info("sockname")[1])

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        try:
            self.packets.append(RtpPacket.parse(data))
        except ValueError:
            return
        self.sources.add((str(addr[0]), int(addr[1])))  # type: ignore[call-overload]

    def send(self, packet: RtpPacket, to: Address) -> None:
        assert self.transport is not None
        self.transport.sendto(packet.serialize(), to)

    def audio(self) -> np.ndarray:
        """The PCMU stream in sequence order, decoded to float."""
        if not self.packets:
            return np.zeros(0, dtype=np.float32)
        first = self.packets[0].sequence_number
        ordered = sorted((((p.sequence_number - first) & 0xFFFF), p.payload)
                         for p in self.packets if p.payload_type == 0)
        payload = b"".join(chunk for _, chunk in ordered)
        return PCMU.decode(payload).astype(np.float32) / 32768

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def write_mulaw_wav(path: Path, samples: np.ndarray) -> bytes:
    """An 8 kHz mono μ-law WAV (format 7), what sipp's rtp_stream plays; returns the μ-law
    bytes written."""
    data = PCMU.encode(np.clip(samples * 32767, -32768, 32767).astype(np.int16))
    fmt = struct.pack("<HHIIHHH", 7, 1, 8000, 8000, 1, 8, 0)
    fact = struct.pack("<I", len(data))
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"fact" + struct.pack("<I", len(fact)) + fact
            + b"data" + struct.pack("<I", len(data)) + data)
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return data


# -- sipp ------------------------------------------------------------------------------------


async def stop_process(process: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """Stop a program a fixture started, by its PID: SIGTERM, and SIGKILL if it has not
    exited `grace` seconds later."""
    if process.returncode is not None:
        return
    process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()


def missing(message: str) -> NoReturn:
    """A third-party program a test needs is not here: skip, except under CI (then fail)."""
    if os.environ.get("CI"):
        pytest.fail(message + " under CI", pytrace=False)
    pytest.skip(message)


def require_sipp() -> str:
    """The sipp binary; skip without it, except under CI (then fail)."""
    path = shutil.which("sipp")
    if path is not None:
        return path
    missing("sipp is missing (apt-get install sip-tester; scripts/install-test-deps.sh)")


@dataclass
class SippRun:
    returncode: int
    output: str
    messages: str  # sipp's -trace_msg log
    errors: str

    def explain(self) -> str:
        return (f"sipp exited {self.returncode}\n--- output (tail)\n{self.output[-3000:]}\n"
                f"--- errors\n{self.errors[-2000:]}\n--- messages (tail)\n"
                f"{self.messages[-4000:]}")

    def count(self, start_line: str, direction: str | None = None) -> int:
        """How many messages sipp logged with this start line (e.g. 'SIP/2.0 180'),
        'sent' or 'received' by sipp, or both."""
        total = 0
        current: str | None = None
        expecting = False
        for line in self.messages.splitlines():
            if " message sent" in line or " message received" in line:
                current = "sent" if " message sent" in line else "received"
                expecting = True
                continue
            if expecting and line.strip():
                expecting = False
                if line.startswith(start_line) and direction in (None, current):
                    total += 1
        return total


async def run_sipp(target: Address, workdir: Path, *args: str, scenario: str | None = None,
                   timeout: float = 30.0, name: str = "sipp",
                   local_port: int | None = None) -> SippRun:
    """Run sipp against `target` until it ends (bounded: killed by PID after `timeout` + 10 s).
    `scenario`: XML text (written to `workdir`), else `args` name a built-in one.
    `local_port`: sipp's SIP port (a free one by default), for sipp as the far end."""
    sipp = require_sipp()
    workdir.mkdir(parents=True, exist_ok=True)
    messages, errors = workdir / f"{name}.msg.log", workdir / f"{name}.err.log"
    command = [sipp, f"{target[0]}:{target[1]}", "-i", HOST,
               "-p", str(local_port or free_udp_port()),
               "-mp", str(free_udp_port()), "-nostdin", "-timeout", f"{timeout:g}",
               "-timeout_error", "-trace_msg", "-message_file", str(messages), "-trace_err",
               "-error_file", str(errors), *args]
    if scenario is not None:
        path = workdir / f"{name}.xml"
        path.write_text(scenario)
        command += ["-sf", str(path)]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL, cwd=workdir)
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout + 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return SippRun(process.returncode, output.decode(errors="replace"),
                   messages.read_text(errors="replace") if messages.exists() else "",
                   errors.read_text(errors="replace") if errors.exists() else "")
