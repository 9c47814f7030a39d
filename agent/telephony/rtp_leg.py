"""A plain RTP leg: the agent's end of a PBX "external media" stream.

The agent binds a UDP port from a configured range and answers with it. With a `remote`
address it takes RTP from that address only; without one it latches to the first source
that sends it RTP (symmetric RTP, how Asterisk's External Media works: Asterisk is told the
agent's address and the agent learns Asterisk's from the first packet). Packets from any
other source, with another payload type, or that do not parse are counted and ignored, and
so are datagrams over `MAX_DATAGRAM` bytes, before they are parsed (`packets_oversize`): 20 ms
of any codec here fits in a few hundred bytes, and a 64 KB datagram decoded and held for
playout would cost the leg hundreds of times what a real packet does. When the leg ends it
lets go of everything it held for playout.
Inbound packets go through a small jitter buffer played on the leg's 20 ms clock (see
rtp_jitter.py); the agent's audio goes back as RTP on the same tick (160 bytes of G.711, or
640 bytes of L16/16000) to the remote. The tick comes from the process's one `SendClock`
(agent/audio/send_clock.py), not from a task per leg. Keypad digits sent as RFC 4733
telephone-events (on `dtmf_payload_type`, 101 unless told otherwise) become DTMF session
events, as on the media-stream websocket.
A leg whose remote came from someone else's words (a SIP offer) has a `remote_check`: a
short burst until the remote's RTP is heard, then nothing (remote_check.py).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ipaddress
import logging
import random
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiortc.rtp import RtpPacket

from agent.end_reason import Ending, EndReason
from agent.errors import CallError
from agent.leg import LegCapabilities, prepare_config
from agent.plugins.base import SessionConfig
from agent.telephony.address_policy import DEFAULT_ALLOWED_NETWORKS, IPNetwork, refusal_for
from agent.telephony.codec import NarrowbandCodec
from agent.telephony.dtmf_sender import DtmfSender
from agent.telephony.leg import SEND_ERRORS, TelephonyLeg
from agent.telephony.remote_check import RemoteCheck
from agent.telephony.rtp_jitter import Concealer, InboundTicks, JitterBuffer
from agent.telephony.srtp import SrtpTransform
from agent.telephony.telephone_event import DEFAULT_PAYLOAD_TYPE as DEFAULT_DTMF_PAYLOAD_TYPE
from agent.telephony.telephone_event import TelephoneEventDetector

if TYPE_CHECKING:
    from agent.call_settings import CallSettings
    from agent.media_agent import MediaAgent

log = logging.getLogger(__name__)

DEFAULT_DYNAMIC_PAYLOAD_TYPE = 96
DYNAMIC_PAYLOAD_TYPES = range(96, 128)
# The largest datagram a leg reads: 60 ms of L16/16000 (1,920 bytes) and an RTP header fit.
MAX_DATAGRAM = 2048

Address = tuple[str, int]

# RFC 3550's fixed header (version 2, no padding, extension or CSRCs: how G.711 RTP comes),
# read and written without aiortc's general parse and serialize (a microsecond or two a
# packet each way); anything else is parsed by aiortc as before.
_FIXED_HEADER = struct.Struct("!BBHLL")
_PLAIN_FIRST_BYTE = 0x80


def parse_rtp(data: bytes) -> RtpPacket:
    """`RtpPacket.parse`, with the plain header read directly (ValueError if malformed)."""
    if len(data) < 12 or data[0] != _PLAIN_FIRST_BYTE:
        return RtpPacket.parse(data)
    _, m_pt, sequence_number, timestamp, ssrc = _FIXED_HEADER.unpack_from(data)
    return RtpPacket(payload_type=m_pt & 0x7F, marker=m_pt >> 7,
                     sequence_number=sequence_number, timestamp=timestamp, ssrc=ssrc,
                     payload=data[12:])


@dataclass(frozen=True)
class RtpSettings:
    bind_host: str = "127.0.0.1"
    advertised_host: str | None = None  # what `local` says; default: bind_host
    port_min: int = 40000
    port_max: int = 40999
    jitter_packets: int = 3  # playout delay in 20 ms units (absorbs reordering and jitter)
    # With a `remote`, take its RTP from its IP on whichever source port it sends from first
    # (many endpoints without symmetric RTP send from another port than they receive on);
    # True: from that exact port only.
    strict_remote_port: bool = False
    # Where a leg may send RTP: the requested remote and a latched source must be inside
    # (see address_policy.py; --rtp-allow).
    allowed_networks: tuple[IPNetwork, ...] = DEFAULT_ALLOWED_NETWORKS

    @property
    def local_host(self) -> str:
        return self.advertised_host or self.bind_host


def check_remote(host: str, settings: RtpSettings, param: str = "remote") -> None:
    """Raise CallError (400/403) unless RTP may be sent to `host` (see address_policy)."""
    refusal = refusal_for(host, settings.allowed_networks)
    if refusal is not None:
        raise CallError(refusal.code, refusal.message, param=param, status=refusal.status)


def format_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RtpProtocol(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.leg: RtpLeg | None = None

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.leg is not None:
            self.leg.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable while the PBX side is not up yet: not a reason to end.
        log.debug("rtp socket error: %r", exc)


class RtpLeg(TelephonyLeg):
    id_prefix = "rtp"
    transport = "rtp"
    can = LegCapabilities(dtmf=True)

    def __init__(self, agent: MediaAgent, codec: NarrowbandCodec,
                 socket: asyncio.DatagramTransport, local: Address, remote: Address | None,
                 rtp: RtpSettings, settings: CallSettings | None = None,
                 dtmf_payload_type: int | None = DEFAULT_DTMF_PAYLOAD_TYPE,
                 leg_id: str | None = None) -> None:
        super().__init__(agent, codec, settings, leg_id)
        self.socket = socket
        self.local = local
        self.remote = remote
        self.latching = remote is None
        self.allowed_networks = rtp.allowed_networks
        self.packets_refused = 0  # from sources a latching leg may not answer
        self.inbound = InboundTicks(
            JitterBuffer(rtp.jitter_packets), Concealer(codec.samples_per_chunk),
            codec.samples_per_chunk, rtp.jitter_packets * codec.samples_per_chunk,
        )
        self.jitter = self.inbound.buffer
        self.strict_remote_port = rtp.strict_remote_port
        self.remote_source: Address | None = None  # where the remote's RTP actually comes from
        self.remote_ssrc: int | None = None
        self.packets_foreign = 0
        self.packets_malformed = 0
        self.packets_oversize = 0  # over MAX_DATAGRAM: dropped unparsed
        self.packets_other_payload = 0
        self.packets_sent = 0
        self.dtmf_payload_type = dtmf_payload_type
        self.telephone_events = TelephoneEventDetector()
        self.dtmf_out = DtmfSender(codec.rtp_samples_per_chunk, codec.rtp_clock)
        self._payload_type = (
            codec.payload_type if codec.payload_type is not None else DEFAULT_DYNAMIC_PAYLOAD_TYPE
        )
        self._ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._first_packet = True
        self._send_clock = agent.send_clock
        self._leave_send_clock: Callable[[], None] | None = None
        self.srtp: SrtpTransform | None = None  # SDES-SRTP: packets (un)protected (srtp.py)
        # A remote named by someone else's words (SDP) is sent a burst only until it is heard
        # (remote_check.py); None: the remote is trusted (named by an authenticated API call).
        self.remote_check: RemoteCheck | None = None

    @property
    def local_text(self) -> str:
        return format_host_port(*self.local)

    # -- inbound ----------------------------------------------------------------------------

    def on_datagram(self, data: bytes, addr: tuple[Any, ...]) -> None:
        if self.closing:
            return
        if len(data) > MAX_DATAGRAM:
            self.packets_oversize += 1  # never parsed, decoded or held
            return
        source = (_normalize_ip(addr[0]), int(addr[1]))
        if self.remote is not None and not self._from_remote(source):
            self.packets_foreign += 1
            return
        if self.srtp is not None:
            opened = self.srtp.unprotect(data)  # None: not authentic (counted there)
            if opened is None:
                return
            data = opened
        try:
            packet = parse_rtp(data)
        except ValueError:
            self.packets_malformed += 1
            return
        if self.remote_check is not None and self.remote is not None:
            self.remote_check.confirm(source[0])  # RTP from the remote: it is there
        if packet.payload_type == self.dtmf_payload_type:
            self._on_telephone_event(packet)
            return
        if not self._accepts_payload_type(packet.payload_type):
            self.packets_other_payload += 1  # comfort noise, RTCP, unasked-for events, ...
            return
        if self.remote is None:
            if refusal_for(source[0], self.allowed_networks) is not None:
                # Latching onto a spoofable source would let anyone aim our RTP at it.
                self.packets_refused += 1
                return
            self.remote = source
            log.info("rtp %s latched to %s", self.id, format_host_port(*source))
        self.remote_source = source
        if self.remote_ssrc != packet.ssrc:
            if self.remote_ssrc is not None:
                self.inbound.reset()
            self.remote_ssrc = packet.ssrc
        self.watchdog.heard()
        self.watchdog.media_started()
        self.inbound.note_packet_samples(self.codec.samples_in(packet.payload))
        self.jitter.push(packet.sequence_number, packet.payload)

    def _from_remote(self, source: Address) -> bool:
        """The remote's RTP: from its exact address when strict (or latched); otherwise from
        its IP, on the first source port that sent audio (later other ports are foreign)."""
        assert self.remote is not None
        if self.strict_remote_port or self.latching:
            return source == self.remote
        if source[0] != self.remote[0]:
            return False
        return self.remote_source is None or source == self.remote_source

    def _on_telephone_event(self, packet: RtpPacket) -> None:
        if self.remote is None:
            self.packets_other_payload += 1  # latching: only the audio's sender is the caller
            return
        digit = self.telephone_events.feed(packet.timestamp, packet.payload)
        if digit is None:
            return
        if self.admit_dtmf():
            self.tasks.spawn(self.dtmf(digit), "dtmf")

    def _accepts_payload_type(self, payload_type: int) -> bool:
        if self.codec.payload_type is not None:
            return payload_type == self.codec.payload_type
        if payload_type in DYNAMIC_PAYLOAD_TYPES and payload_type != self.dtmf_payload_type:
            self._payload_type = payload_type  # answer with whatever dynamic type it uses
            return True
        return False

    def _play_one(self) -> None:
        pcm = self.inbound.tick(self.codec.decode)
        if pcm is not None:
            self.push_inbound(pcm)

    # -- outbound ---------------------------------------------------------------------------

    def start_sending(self) -> None:
        self._leave_send_clock = self._send_clock.join(self._send_due)

    def _stop_sending(self) -> None:
        if self._leave_send_clock is not None:
            self._leave_send_clock()

    def _send_due(self, tick_at: float, now: float) -> None:
        """The send clock's tick on this leg's phase: the packets now due (one, as a rule)."""
        if self.closing:
            self._stop_sending()
            return
        for _ in range(self.pacer.take_due(tick_at, now)):
            try:
                self._send_one(self.next_payload())
            except SEND_ERRORS as exc:
                self._stop_sending()
                self.end_on_send_error(exc)
                return

    def _send_one(self, payload: bytes) -> None:
        self._play_one()  # the inbound side runs on the same 20 ms clock
        self._send_packet(payload)

    def _send_packet(self, payload: bytes) -> None:
        if self.remote is None:
            return  # latching: nowhere to send until the remote speaks first
        if self.remote_check is not None and not self.remote_check.may_send():
            return  # not heard yet, and its burst is spent (remote_check.py)
        event = self.dtmf_out.next_packet(self._timestamp) if self.dtmf_out.busy else None
        if event is not None and self.dtmf_payload_type is not None:
            # A digit being sent takes this tick's place (RFC 4733).
            data = _FIXED_HEADER.pack(
                _PLAIN_FIRST_BYTE, (0x80 if event.marker else 0) | self.dtmf_payload_type,
                self._sequence, event.timestamp, self._ssrc) + event.payload
        else:
            # The bytes of aiortc's RtpPacket(...).serialize(), without the object.
            data = _FIXED_HEADER.pack(
                _PLAIN_FIRST_BYTE, (0x80 if self._first_packet else 0) | self._payload_type,
                self._sequence, self._timestamp, self._ssrc) + payload
            self._first_packet = False
        self._sequence = (self._sequence + 1) & 0xFFFF
        self._timestamp = (self._timestamp + self.codec.rtp_samples_per_chunk) & 0xFFFFFFFF
        self.socket.sendto(data if self.srtp is None else self.srtp.protect(data), self.remote)
        self.packets_sent += 1

    def send_dtmf(self, digits: str) -> int:
        """Queue keypad digits (checked by dtmf_sender.check_digits) to be sent as RFC 4733
        telephone-events on this leg's stream; how many wait. CallError: no telephone-event
        payload type (409 dtmf_not_negotiated), no remote yet, or too many digits waiting."""
        if self.dtmf_payload_type is None:
            raise CallError("dtmf_not_negotiated", "this call has no telephone-event payload "
                            "type to send DTMF with", status=409)
        if self.remote is None:
            raise CallError("remote_unknown", "this leg has not heard its remote yet: "
                            "nowhere to send DTMF", status=409)
        try:
            self.dtmf_out.add(digits)
        except ValueError as exc:
            raise CallError("dtmf_queue_full", str(exc), status=409) from None
        return self.dtmf_out.pending

    def _ms(self, samples: int | None) -> float | None:
        return None if samples is None else round(1000 * samples / self.codec.sample_rate, 3)

    async def close_socket(self, reason: Ending) -> None:
        self._stop_sending()
        self.socket.close()
        self._release_inbound()

    def _release_inbound(self) -> None:
        """Nothing received outlives the leg: held packets and samples go, and the socket's
        protocol forgets the leg (late datagrams then reach nothing)."""
        self.inbound.reset()
        protocol = self.socket.get_protocol()
        if isinstance(protocol, RtpProtocol):
            protocol.leg = None

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "local": self.local_text,
            "remote": format_host_port(*self.remote) if self.remote else None,
            "payload_type": self._payload_type,
            "packets_sent": self.packets_sent,
            "packets_foreign": self.packets_foreign,
            "packets_malformed": self.packets_malformed,
            "packets_oversize": self.packets_oversize,
            "packets_other_payload": self.packets_other_payload,
            "packets_refused": self.packets_refused,
            "dtmf_payload_type": self.dtmf_payload_type,
            "telephone_event_packets": self.telephone_events.packets,
            "dtmf_sent": self.dtmf_out.sent,
            "remote_source": format_host_port(*self.remote_source) if self.remote_source else None,
            "packet_ms": self._ms(self.inbound.packet_samples),
            "packet_ms_seen": sorted(self._ms(n) for n in self.inbound.packet_sizes_seen),
            "jitter": {**self.jitter.stats.to_dict(), "held": self.jitter.held,
                       "held_bytes": self.jitter.held_bytes},
            **({"srtp": self.srtp.stats()} if self.srtp is not None else {}),
            **(self.remote_check.stats() if self.remote_check is not None else {}),
        }


@functools.lru_cache(maxsize=4096)  # parsed once per source, not 50 times a second per leg
def _normalize_ip(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return host


async def bind_rtp_port(
    settings: RtpSettings,
) -> tuple[asyncio.DatagramTransport, RtpProtocol, int]:
    """Bind an even port in the range (RTP convention: RTCP would take the odd one above)."""
    loop = asyncio.get_running_loop()
    first = settings.port_min + (settings.port_min % 2)
    ports = list(range(first, settings.port_max + 1, 2)) or [settings.port_min]
    offset = random.randrange(len(ports))  # spread legs so a just-freed port rests a while
    for port in ports[offset:] + ports[:offset]:
        try:
            transport, protocol = await loop.create_datagram_endpoint(
                RtpProtocol, local_addr=(settings.bind_host, port)
            )
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue
            raise CallError("rtp_bind_failed", f"could not open an RTP port: {exc.strerror}",
                            status=500) from None
        return transport, protocol, port
    raise CallError("no_rtp_port", f"every RTP port in {settings.port_min}-{settings.port_max} "
                    "is in use; retry later", status=503)


async def open_rtp_leg(agent: MediaAgent, remote: Address | None, codec: NarrowbandCodec,
                       session: SessionConfig, settings: RtpSettings,
                       dtmf_payload_type: int | None = DEFAULT_DTMF_PAYLOAD_TYPE) -> RtpLeg:
    """Admit, bind, open the plugin session and start sending. Raises CallError/PluginError."""
    if remote is not None:
        check_remote(remote[0], settings)
    with agent.admit():
        transport, protocol, port = await bind_rtp_port(settings)
        leg = RtpLeg(agent, codec, transport, (settings.local_host, port), remote, settings,
                     dtmf_payload_type=dtmf_payload_type)
    protocol.leg = leg
    try:
        await leg.open_plugin_slot(await prepare_config(leg.plugin, session))
    except BaseException:
        await leg.close(EndReason.SETUP_FAILED)
        raise
    leg.start_watchdog()
    leg.start_sending()
    log.info("rtp %s start local=%s remote=%s codec=%s", leg.id, leg.local_text,
             format_host_port(*remote) if remote else "latch", codec.name)
    return leg
