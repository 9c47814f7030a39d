"""Settings aiortc does not expose, applied to its objects after they are built.

Kept in this package (the SCTP receive path in `sctp_limit.py`, the ICE host ports in
`port_range.py`, the advertised addresses in `advertise.py`, ICE restart in
`ice_restart.py`, every call on one UDP port in `udp_mux.py`) so an aiortc or aioice upgrade
that renames these internals breaks here and nowhere else.
"""

from __future__ import annotations

import logging
import threading
from fractions import Fraction
from typing import Any, TypeVar, overload

import av
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import get_decoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtcdtlstransport import RTCCertificate
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add

from agent.rtc_tuning.ice_restart import missing_restart_internals
from agent.rtc_tuning.port_range import missing_port_internals
from agent.rtc_tuning.sctp_limit import missing_sctp_internals
from agent.rtc_tuning.udp_mux import missing_mux_internals

log = logging.getLogger(__name__)

JITTER_CAPACITY = 16  # packets; a power of two, as aiortc requires


class ImmediateAudioJitterBuffer(JitterBuffer):
    """Releases each audio packet the moment it arrives in order; late packets are dropped.

    An audio RTP packet is a whole frame, so nothing needs reassembling. aiortc's buffer
    instead waits for the next packet to know a frame is complete (20 ms) plus its prefetch
    (4 packets, 80 ms). The agent absorbs network jitter after decoding instead, in the
    ticker's caller FIFO, which keeps only the cushion that jitter actually needed.
    """

    def __init__(self) -> None:
        super().__init__(capacity=JITTER_CAPACITY)
        self._expected: int | None = None

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        sequence = packet.sequence_number
        if self._expected is not None and uint16_add(sequence, -self._expected) >= 0x8000:
            return False, None  # older than what was already played out
        self._expected = uint16_add(sequence, 1)
        # `_data`: the depayloaded payload aiortc sets on the packet, undeclared in its class.
        data = packet._data  # type: ignore[attr-defined]
        return False, JitterFrame(data=data, timestamp=packet.timestamp)


def set_audio_jitter_prefetch(receiver: RTCRtpReceiver, packets: int) -> None:
    """How many later packets aiortc's jitter buffer waits for before releasing audio.

    aiortc fixes this at 4 (about 80 ms). 0 releases every packet on arrival
    (`ImmediateAudioJitterBuffer`); 1 or more keeps aiortc's buffer with that prefetch, which
    also reorders packets that arrive out of order within its window.
    """
    attribute = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, attribute):
        log.warning("aiortc internals changed: jitter buffer depth not applied")
        return
    buffer = (
        ImmediateAudioJitterBuffer()
        if packets <= 0
        else JitterBuffer(capacity=JITTER_CAPACITY, prefetch=packets)
    )
    setattr(receiver, attribute, buffer)


AUDIO_CODECS = ("opus", "PCMU", "PCMA")  # the audio codecs aiortc can negotiate


def parse_codec_list(text: str) -> tuple[str, ...]:
    """ "opus,pcmu" → ("opus", "PCMU"): canonical names, in the order given.

    Raises ValueError for an unknown name or an empty list, so a typo fails at startup
    instead of refusing every call with no_common_codec.
    """
    canonical = {name.lower(): name for name in AUDIO_CODECS}
    names: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        if name.lower() not in canonical:
            raise ValueError(f"unknown audio codec '{name}' (known: {', '.join(AUDIO_CODECS)})")
        if canonical[name.lower()] not in names:
            names.append(canonical[name.lower()])
    if not names:
        raise ValueError("at least one audio codec is needed")
    return tuple(names)


def is_opus(codec: RTCRtpCodecParameters) -> bool:
    return codec.mimeType.lower() == "audio/opus"


class MonoOpusDecoder:
    """Opus to one channel at 48 kHz, for a mono plugin.

    libopus's own downmix of a stereo stream is the mean of its two channels (what the
    resampler's input would otherwise be averaged to), and decoding one channel costs about
    60 % of decoding two (51 vs 83 µs per 20 ms here), before the resampler also gets half
    the samples.
    """

    RATE = 48000

    def __init__(self) -> None:
        self.codec = av.CodecContext.create("libopus", "r")
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = self.RATE
        self.time_base = Fraction(1, self.RATE)

    def decode(self, encoded_frame: JitterFrame) -> list[av.AudioFrame]:
        packet = av.Packet(encoded_frame.data)
        packet.pts = encoded_frame.timestamp
        packet.time_base = self.time_base
        return list(self.codec.decode(packet))


class InlineAudioDecoding:
    """Stands in for aiortc's per-receiver decoder queue: decodes on the event loop.

    aiortc hands every 20 ms packet to a decoder thread and back (a queue put, a thread
    wake-up, a cross-thread coroutine hop); with a dozen calls those GIL hand-offs cost more
    than the Opus decode itself (tens of microseconds). aiortc's decoder thread still starts
    but just waits here until the receiver stops, then ends the track as usual.
    """

    def __init__(self, receiver: RTCRtpReceiver, channels: int = 2) -> None:
        self._receiver = receiver
        self._channels = channels
        self._decoder: Any = None
        self._codec_name: str | None = None
        self._stopped = threading.Event()
        self.decode_errors = 0

    def put(self, item: tuple[RTCRtpCodecParameters, JitterFrame] | None) -> None:
        if item is None:
            self._stopped.set()
            return
        track = self._receiver._track
        assert track is not None  # installed only on a receiver that has its track
        queue = track._queue
        for frame in self.decode(*item):
            queue.put_nowait(frame)

    def decode(self, codec: RTCRtpCodecParameters, encoded_frame: JitterFrame
               ) -> list[av.AudioFrame]:
        if codec.name != self._codec_name:
            self._decoder = (MonoOpusDecoder() if self._channels == 1 and is_opus(codec)
                             else get_decoder(codec))
            self._codec_name = codec.name
        try:
            return self._decoder.decode(encoded_frame)
        except av.FFmpegError:
            self.decode_errors += 1  # keep the decoder state, as aiortc does
            return []

    def get(self) -> None:
        self._stopped.wait()
        return None


DecodingT = TypeVar("DecodingT", bound=InlineAudioDecoding)


@overload
def decode_audio_inline(receiver: RTCRtpReceiver, channels: int = 2
                        ) -> InlineAudioDecoding | None: ...
@overload
def decode_audio_inline(receiver: RTCRtpReceiver, channels: int, kind: type[DecodingT]
                        ) -> DecodingT | None: ...
def decode_audio_inline(receiver: RTCRtpReceiver, channels: int = 2,
                        kind: type[InlineAudioDecoding] = InlineAudioDecoding,
                        ) -> InlineAudioDecoding | None:
    """Install `InlineAudioDecoding` (or a subclass, `kind`) on a receiver that has not started
    yet (None: aiortc's internals changed and decoding stays on its thread). With `channels=1`
    Opus is decoded to mono by libopus itself."""
    attribute = "_RTCRtpReceiver__decoder_queue"
    if not hasattr(receiver, attribute) or getattr(receiver, "_track", None) is None:
        log.warning("aiortc internals changed: decoding stays on aiortc's thread")
        return None
    decoding = kind(receiver, channels)
    setattr(receiver, attribute, decoding)
    return decoding


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    """The codecs negotiated for a transceiver (empty where aiortc no longer exposes them)."""
    return list(getattr(transceiver, "_codecs", []))


def is_no_common_codec(exc: Exception) -> bool:
    """Whether setRemoteDescription failed because no offered codec is one aiortc has.

    aiortc says so only in its message text; if that text changes the caller still gets a
    coded 400 (invalid_sdp), only a less precise one.
    """
    return "description send parameters" in str(exc)


def restrict_codecs(transceiver: RTCRtpTransceiver, allowed: list[str]) -> list[str]:
    """Answer with the agent's first choice among the offered codecs that are `allowed`
    (e.g. ["opus", "PCMU"], in the agent's preference order), and only that one.

    One codec in the answer makes both directions use it: an aiortc offerer otherwise sends
    with its own first preference among the answered codecs (a PCMU-first caller would send
    PCMU while the agent sends Opus). Must run after setRemoteDescription and before
    createAnswer. Returns what is left (empty: no common codec).
    """
    if not hasattr(transceiver, "_codecs"):
        log.warning("aiortc internals changed: codecs left to aiortc's own negotiation")
        return list(allowed)
    order = [name.lower() for name in allowed]
    codecs = [
        codec for codec in negotiated_codecs(transceiver)
        if codec.mimeType.split("/")[-1].lower() in order
    ]
    codecs.sort(key=lambda codec: order.index(codec.mimeType.split("/")[-1].lower()))
    codecs = codecs[:1]
    transceiver._codecs = codecs
    return [codec.mimeType.split("/")[-1] for codec in codecs]


_original_host_addresses = None


def limit_host_addresses(addresses: list[str] | None) -> None:
    """Gather ICE host candidates only on `addresses` (None: every interface, aioice's default).

    aioice never offers loopback on its own; `["127.0.0.1"]` keeps a test call or a
    same-host bridge entirely on the loopback interface. Process-wide, like aioice's lookup.
    """
    global _original_host_addresses
    import aioice.ice

    if _original_host_addresses is None:
        _original_host_addresses = aioice.ice.get_host_addresses
    if addresses is None:
        aioice.ice.get_host_addresses = _original_host_addresses
        return
    chosen = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


# aiortc offers only ECDHE-ECDSA suites, so it can never agree with a DTLS server that holds
# an RSA certificate (GStreamer's default, and several SIP-to-WebRTC gateways'): the handshake
# fails with "no shared cipher" after the offer was already answered.
DTLS_CIPHERS = (
    b"ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:"
    b"ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:"
    b"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:"
    b"ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA"
)
_original_ssl_context: Any = None


def accept_rsa_dtls_peers() -> bool:
    """Let DTLS agree with peers holding RSA certificates as well as ECDSA ones, in both roles.

    Process-wide and idempotent. Returns False (and logs) when aiortc no longer builds its
    context where this expects, leaving aiortc's own cipher list in place.
    """
    global _original_ssl_context
    if _original_ssl_context is not None:
        return True
    original = getattr(RTCCertificate, "_create_ssl_context", None)
    if original is None:
        log.warning("aiortc internals changed: DTLS stays ECDSA-only (RSA peers will fail)")
        return False

    def create_ssl_context(self: RTCCertificate, srtp_profiles: list[Any]) -> Any:
        context = original(self, srtp_profiles)
        context.set_cipher_list(DTLS_CIPHERS)
        return context

    _original_ssl_context = original
    # (a deliberate patch of aiortc's method: mypy forbids assigning to methods)
    RTCCertificate._create_ssl_context = create_ssl_context  # type: ignore[method-assign]
    return True


def sent_payload_bytes(sender: RTCRtpSender) -> int | None:
    """RTP payload bytes the sender has sent (what its `getStats()` calls bytesSent, read
    without awaiting a stats report), or None when aiortc no longer keeps the count."""
    count = getattr(sender, "_RTCRtpSender__octet_count", None)
    return count if isinstance(count, int) else None


async def missing_internals() -> list[str]:
    """The aiortc internals this module relies on that the installed aiortc lacks.

    Checked once at start-up so an aiortc upgrade shows up as one clear log line; each
    adjustment also falls back to aiortc's own behaviour by itself when its name is gone.
    """
    missing = [f"{name} (data-channel messages reassembled whole)"
               for name in missing_sctp_internals()]
    missing += missing_port_internals()
    missing += missing_mux_internals()
    missing += missing_restart_internals()
    if not hasattr(RTCCertificate, "_create_ssl_context"):
        missing.append("RTCCertificate._create_ssl_context (DTLS stays ECDSA-only)")
    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("audio")
        if not hasattr(transceiver, "_codecs"):
            missing.append("RTCRtpTransceiver._codecs (codec choice left to aiortc)")
        if sent_payload_bytes(transceiver.sender) is None:
            missing.append("RTCRtpSender.__octet_count (outbound bytes read 0 without the "
                           "inline encoder)")
        for attribute, fallback in (
            ("_RTCRtpReceiver__jitter_buffer", "aiortc's jitter depth"),
            ("_RTCRtpReceiver__decoder_queue", "decoding on aiortc's thread"),
        ):
            if not hasattr(transceiver.receiver, attribute):
                missing.append(f"RTCRtpReceiver.{attribute.split('__')[-1]} ({fallback})")
    finally:
        await pc.close()
    return missing
