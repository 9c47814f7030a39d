"""The load-test media path of a WebRTC call: SRTP sent and kept on the ICE socket directly.

A load test must measure the agent, not its callers, and through aiortc's media path a
caller pays per packet about what the agent's own aiortc endpoint pays: sending, a paced
track per call, an `RtpPacket` object with header extensions, three awaited layers down to
the socket; receiving, aioice's STUN parse attempt, a queue hop to the DTLS transport's task,
an `RtpPacket` parse, the jitter buffer and the receiver's statistics. In load-test mode
(`defer_decoding`, a load run without a script) nothing reads the agent's audio during the
call, so once ICE and DTLS are up (still aiortc's: the handshake, the keys, consent
freshness, RTCP and the data channel stay on its path) this takes the call's audio off it:

- sending: every call of the process is driven by the peer's one shared 20 ms tick
  (`send_tick.py`); per packet a 12-byte header packed directly (the
  sender's SSRC and the negotiated payload type, which the agent routes on; no header
  extensions), libsrtp's protect with the transport's own session, one `sendto` to the
  nominated pair;
- receiving: the ICE socket is read here instead of by its asyncio transport
  (ice_socket.py, with the kernel's arrival times, so a busy peer loop does not make the agent
  look late): each SRTP packet (not SRTCP) is kept with its arrival time, everything else
  (STUN, DTLS, SRTCP) goes on to aioice's protocol at once, as before;
- after the call (`replay`) the kept packets are unprotected in arrival order with the
  transport's receive session, parsed, counted (received, lost by RFC 3550 A.3 extended
  sequence numbers, interarrival jitter 6.4.1) and decoded into the call's recording.

It reads aiortc's and aioice's internals (the DTLS transport's SRTP sessions and the ICE
connection's nominated pair); `attach` returns None where they are not found and the call
then stays on aiortc's path (`DeferredDecoding`), which measures the same things at a
higher cost.
"""

from __future__ import annotations

import functools
import logging
import secrets
import struct
from collections.abc import Callable
from typing import Any

import pylibsrtp
from aioice import Connection
from aiortc import RTCDtlsTransport, RTCRtpSender, RTCRtpTransceiver
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import RtpPacket

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME
from agent.rtc_tuning import InlineAudioDecoding
from agent.rtc_tuning.source_check import source_of
from agent.testing.peer.recording import Recording
from agent.testing.peer.transports.base import PeerCall
from agent.testing.peer.transports.ice_socket import IceSocketReader, nominated_pair
from agent.testing.peer.transports.send_tick import send_tick

log = logging.getLogger(__name__)

RTP_HEADER = struct.Struct("!BBHII")


class DirectSrtp:
    """One call's audio both ways on its ICE socket (see the module docstring)."""

    def __init__(self, call: PeerCall, codec: RTCRtpCodecParameters, ssrc: int,
                 tx: pylibsrtp.Session, rx: pylibsrtp.Session, protocol: Any,
                 remote: tuple[str, int], ticks_per_packet: int) -> None:
        self.call = call
        self.codec = codec
        self.payload_type = codec.payloadType or 0
        self.ssrc = ssrc
        self._tx = tx
        self._rx = rx
        self._protocol = protocol
        self._remote = remote
        self._ticks = ticks_per_packet
        self._sequence = secrets.randbits(16)
        self._timestamp = secrets.randbits(32)
        self._pacer = Pacer(MonotonicClock(), PTIME)
        self._leave: Callable[[], None] | None = None
        self.arrivals: list[float] = []
        self.packets: list[bytes] = []
        self.send_errors = 0

    @staticmethod
    @functools.cache
    def available() -> bool:
        """Whether this aiortc and aioice keep what `attach` reads (read from their source, so
        a call can decide before it connects whether aiortc's sender will send at all)."""
        dtls, connection = source_of(RTCDtlsTransport), source_of(Connection)
        return ("_tx_srtp" in dtls and "_rx_srtp" in dtls and "_nominated" in connection
                and "_ssrc" in source_of(RTCRtpSender))

    @classmethod
    def attach(cls, call: PeerCall, transceiver: RTCRtpTransceiver,
               codec: RTCRtpCodecParameters, reader: IceSocketReader | None
               ) -> DirectSrtp | None:
        """Take over `transceiver`'s audio once its transport is connected, the agent's packets
        from `reader` (the call's ICE socket, read since ICE completed); None (the call stays
        on aiortc's path) where aiortc's or aioice's internals are not as expected."""
        sender = transceiver.sender
        dtls = sender.transport
        tx, rx = getattr(dtls, "_tx_srtp", None), getattr(dtls, "_rx_srtp", None)
        pair = nominated_pair(dtls)
        ssrc = getattr(sender, "_ssrc", None)
        if (reader is None or pair is None or codec.payloadType is None or not isinstance(ssrc, int)
                or not isinstance(tx, pylibsrtp.Session)
                or not isinstance(rx, pylibsrtp.Session)):
            log.warning("aiortc/aioice internals changed: the load-test media stays on "
                        "aiortc's path")
            return None
        ticks = round(codec.clockRate * PTIME)
        direct = cls(call, codec, ssrc, tx, rx, pair.protocol, pair.remote_addr, ticks)
        reader.on_rtp = direct._keep
        direct._leave = send_tick().join(direct._send_due)
        return direct

    # -- live ------------------------------------------------------------------------------

    def _keep(self, data: bytes, arrived: float) -> bool:
        self.arrivals.append(arrived)
        self.packets.append(data)
        return True

    def _send_due(self, tick_at: float, now: float) -> None:
        transport = self._protocol.transport
        for _ in range(self._pacer.take_due(tick_at, now)):
            payload = self.call.next_payload(now)
            header = RTP_HEADER.pack(0x80, 0x80 | self.payload_type, self._sequence,
                                     self._timestamp, self.ssrc)
            self._sequence = (self._sequence + 1) & 0xFFFF
            self._timestamp = (self._timestamp + self._ticks) & 0xFFFFFFFF
            if transport is None or transport.is_closing():
                self.send_errors += 1
                continue
            transport.sendto(self._tx.protect(header + payload), self._remote)

    def stop(self) -> None:
        """Stop sending (the call gives its ICE socket back to aioice)."""
        if self._leave is not None:
            self._leave()
            self._leave = None

    # -- after the call --------------------------------------------------------------------

    def replay(self, recording: Recording, decoding: InlineAudioDecoding) -> None:
        """Unprotect, count and decode the kept packets into `recording` and onto the call
        (packets received and lost, jitter)."""
        rate = self.codec.clockRate
        kept: list[tuple[int, float, RtpPacket]] = []
        base: int | None = None
        highest = 0  # extended sequence number
        jitter, last_transit = 0.0, None
        for arrived, data in zip(self.arrivals, self.packets, strict=True):
            try:
                packet = RtpPacket.parse(self._rx.unprotect(data))
            except (pylibsrtp.Error, ValueError):
                continue
            if packet.payload_type != self.payload_type:
                continue
            seq = packet.sequence_number
            if base is None:
                base = highest = seq
                extended = seq
            else:
                cycles, low = highest & ~0xFFFF, highest & 0xFFFF
                delta = (seq - low) & 0xFFFF
                if delta < 0x8000:
                    extended = cycles + seq + (0x10000 if seq < low else 0)
                    highest = max(highest, extended)
                else:  # late: from before the highest so far
                    extended = highest - ((low - seq) & 0xFFFF)
            transit = arrived - packet.timestamp / rate
            if last_transit is not None:
                jitter += (abs(transit - last_transit) - jitter) / 16
            last_transit = transit
            kept.append((extended, arrived, packet))
        self.arrivals, self.packets = [], []
        if base is not None:
            self.call.packets_received = (self.call.packets_received or 0) + len(kept)
            self.call.packets_lost = (self.call.packets_lost or 0) + max(
                0, highest - base + 1 - len(kept))
            self.call.jitter = jitter
        kept.sort(key=lambda item: item[0])  # the jitter buffer's order
        for _, arrived, packet in kept:
            frame = JitterFrame(data=packet.payload, timestamp=packet.timestamp)
            for decoded in decoding.decode(self.codec, frame):
                recording.add(decoded, arrived)
