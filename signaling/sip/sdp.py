"""SDP offer/answer for SIP calls (RFC 4566, RFC 3264): read a caller's offer, answer it.

A SIP offer may carry several streams, codecs by static or dynamic payload type,
telephone-event, a direction (hold is `a=sendonly`/`inactive`, or an old-style
`c=0.0.0.0`) at session or media level. The agent takes the first audio stream over
RTP/AVP that offers a codec it speaks: wideband first where offered (G.722 on its static
type 9, whose rtpmap says 8000 by RFC 3551's rule although it samples at 16000, then
L16/16000 on a dynamic type), else PCMU or PCMA in the offerer's order of preference; and
telephone-event on the codec's RTP clock where offered, answers every other stream with
port 0 as RFC 3264 §6 requires, and mirrors the direction. Offers it cannot serve come back
as `SdpError` with the status to answer (488), never as an exception.

(WebRTC offers are another matter, handled by aiortc: agent/webrtc/sdp.py.)
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from agent.telephony.codec import G722, L16_16K, PCMA, PCMU, NarrowbandCodec

MAX_SDP_BYTES = 16 * 1024
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
ANSWER_DIRECTION = {"sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly",
                    "inactive": "inactive"}
STATIC_CODECS: dict[int, NarrowbandCodec] = {0: PCMU, 8: PCMA, 9: G722}
DYNAMIC_CODECS: dict[tuple[str, int], NarrowbandCodec] = {("L16", 16000): L16_16K}
# What a SIP call may use, and the codecs taken first whenever offered (in this order),
# before the offerer's own order applies to the rest.
SIP_CODECS = ("G722", "L16/16000", "PCMU", "PCMA")
PREFERRED = ("G722", "L16/16000")
TELEPHONE_EVENT = "telephone-event"


@dataclass(frozen=True)
class SdpError:
    code: str
    message: str
    status: int = 488  # Not Acceptable Here
    warning: int = 305  # RFC 3261 §20.43: 304 media type not available, 305 incompatible format


@dataclass
class MediaDescription:
    media: str
    port: int
    proto: str
    formats: list[str]
    address: str | None = None  # the c= that applies (media level, else session level)
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)  # pt → (NAME, rate)
    multichannel: set[int] = field(default_factory=set)  # pts whose rtpmap names 2+ channels
    fmtp: dict[int, str] = field(default_factory=dict)
    direction: str | None = None  # media-level attribute, if any
    ptime: int | None = None


@dataclass
class SessionDescription:
    origin: str
    address: str | None  # session-level c=
    direction: str  # session-level attribute, default sendrecv
    media: list[MediaDescription]

    def direction_of(self, media: MediaDescription) -> str:
        return media.direction or self.direction


@dataclass(frozen=True)
class AudioChoice:
    """What the agent takes from an offer: the stream, its codec and where to send."""

    index: int  # which m= line
    codec: NarrowbandCodec
    payload_type: int
    dtmf_payload_type: int | None
    dtmf_fmtp: str | None
    remote: tuple[str, int] | None  # None: on hold the old way (c=0.0.0.0)
    offer_direction: str
    ptime: int | None
    proto: str = "RTP/AVP"  # or RTP/SAVP (SDES-SRTP, sdes.py)

    @property
    def answer_direction(self) -> str:
        if self.remote is None:
            return "inactive" if self.offer_direction in ("recvonly", "inactive") else "recvonly"
        return ANSWER_DIRECTION[self.offer_direction]

    @property
    def agent_sends(self) -> bool:
        return self.remote is not None and self.answer_direction in ("sendrecv", "sendonly")

    @property
    def caller_sends(self) -> bool:
        return self.offer_direction in ("sendrecv", "sendonly")


def parse_sdp(body: bytes) -> SessionDescription | SdpError:
    """The parts of an SDP body the agent reads; SdpError (400) when it is not SDP."""
    if len(body) > MAX_SDP_BYTES:
        return SdpError("sdp_too_large", f"SDP over {MAX_SDP_BYTES} bytes", 400)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return SdpError("sdp_not_utf8", "the SDP is not UTF-8", 400)
    origin = ""
    session_address: str | None = None
    session_direction = "sendrecv"
    media: list[MediaDescription] = []
    saw_version = False
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line:
            continue
        kind, eq, value = line.partition("=")
        if not eq or len(kind) != 1:
            return SdpError("sdp_malformed", f"not an SDP line: {line[:40]!r}", 400)
        if kind == "v":
            saw_version = True
        elif kind == "o":
            origin = value
        elif kind == "c":
            address = _connection_address(value)
            if media:
                media[-1].address = address
            else:
                session_address = address
        elif kind == "m":
            description = _media_line(value)
            if description is None:
                return SdpError("sdp_malformed", f"invalid m= line: {line[:60]!r}", 400)
            media.append(description)
        elif kind == "a":
            direction = _attribute(value, media[-1] if media else None)
            if direction is not None:
                if media:
                    media[-1].direction = direction
                else:
                    session_direction = direction
    if not saw_version or not media:
        return SdpError("sdp_malformed", "no v= line or no m= line", 400)
    for description in media:
        if description.address is None:
            description.address = session_address
    return SessionDescription(origin, session_address, session_direction, media)


def _connection_address(value: str) -> str:
    """`IN IP4 192.0.2.1` → the address (possibly `0.0.0.0` or a hostname: judged later)."""
    parts = value.split()
    if len(parts) < 3:
        return ""
    return parts[2].split("/", 1)[0]  # a multicast TTL suffix is dropped (and refused later)


def _media_line(value: str) -> MediaDescription | None:
    parts = value.split()
    if len(parts) < 4:
        return None
    port_text = parts[1].split("/", 1)[0]
    if not port_text.isdigit() or int(port_text) > 65535:
        return None
    return MediaDescription(parts[0], int(port_text), parts[2], parts[3:])


def _attribute(value: str, media: MediaDescription | None) -> str | None:
    """Record rtpmap/fmtp/ptime on the current stream; return a direction attribute."""
    name, _, rest = value.partition(":")
    if name in DIRECTIONS:
        return name
    if media is None:
        return None
    if name == "rtpmap":
        pt_text, _, encoding = rest.partition(" ")
        pieces = encoding.strip().split("/")
        if pt_text.isdigit() and len(pieces) >= 2 and pieces[1].isdigit():
            media.rtpmap[int(pt_text)] = (pieces[0].upper(), int(pieces[1]))
            if len(pieces) >= 3 and pieces[2].strip() != "1":
                media.multichannel.add(int(pt_text))  # e.g. L16/16000/2: the agent is mono
    elif name == "fmtp":
        pt_text, _, params = rest.partition(" ")
        if pt_text.isdigit():
            media.fmtp[int(pt_text)] = params.strip()
    elif name == "ptime" and rest.strip().isdigit():
        media.ptime = int(rest.strip())
    return None


def _codec_for(media: MediaDescription, pt: int) -> NarrowbandCodec | None:
    """PCMU/PCMA/G.722 on their static payload types (an rtpmap, if any, must agree: the RTP
    leg takes them on their static type only); L16/16000 on a dynamic type by its rtpmap."""
    mapped = media.rtpmap.get(pt)
    if pt in media.multichannel:
        return None
    if 96 <= pt <= 127:
        return DYNAMIC_CODECS.get(mapped) if mapped is not None else None
    codec = STATIC_CODECS.get(pt)
    if codec is None or (mapped is not None and mapped != (codec.encoding, codec.rtp_clock)):
        return None
    return codec


def choose_audio(offer: SessionDescription, codecs: tuple[str, ...] = SIP_CODECS,
                 prefer: tuple[str, ...] = PREFERRED,
                 protos: tuple[str, ...] = ("RTP/AVP",)) -> AudioChoice | SdpError:
    """The first audio stream over one of `protos` the agent can serve, with the first of
    `prefer` it offers, else the offerer's first usable codec among `codecs`."""
    wanted = {name.upper() for name in codecs}
    rank = {name.upper(): index for index, name in enumerate(prefer)}
    saw_audio = False
    for index, media in enumerate(offer.media):
        if media.media != "audio" or media.port == 0:
            continue
        saw_audio = True
        if media.proto.upper() not in protos:
            continue
        chosen: tuple[NarrowbandCodec, int] | None = None
        events: dict[int, int] = {}  # telephone-event's clock rate → its first payload type
        for fmt in media.formats:
            if not fmt.isdigit():
                continue
            pt = int(fmt)
            mapped = media.rtpmap.get(pt)
            if mapped is not None and mapped[0] == TELEPHONE_EVENT.upper():
                events.setdefault(mapped[1], pt)
                continue
            codec = _codec_for(media, pt)
            if codec is None or codec.name.upper() not in wanted:
                continue
            if chosen is None or (rank.get(codec.name.upper(), len(rank))
                                  < rank.get(chosen[0].name.upper(), len(rank))):
                chosen = (codec, pt)
        if chosen is None:
            continue
        dtmf = events.get(chosen[0].rtp_clock)  # on the audio's own RTP clock (RFC 4733)
        remote, problem = _remote(media)
        if problem is not None:
            return problem
        return AudioChoice(index, chosen[0], chosen[1], dtmf, media.fmtp.get(dtmf) if dtmf
                           is not None else None, remote, offer.direction_of(media), media.ptime,
                           media.proto.upper())
    if not saw_audio:
        return SdpError("no_audio_stream", "the offer has no audio stream", warning=304)
    return SdpError("no_common_codec", "no audio stream offers "
                    f"{', '.join(codecs)} over {' or '.join(protos)}")


def _remote(media: MediaDescription) -> tuple[tuple[str, int] | None, SdpError | None]:
    address = media.address or ""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None, SdpError("sdp_address_not_ip",
                              f"c= must be an IP address, not {address[:60]!r}")
    if ip.is_unspecified:
        return None, None  # RFC 2543 hold: no media to send
    return (str(ip), media.port), None


def build_answer(offer: SessionDescription, choice: AudioChoice, local_ip: str,
                 local_port: int, session_id: int, version: int,
                 direction: str | None = None, extra: tuple[str, ...] = ()) -> bytes:
    """The answer: the chosen stream with one codec (and telephone-event), every other
    stream refused with port 0, the direction mirrored (or `direction` when given);
    `extra` attribute lines go on the chosen stream (SDES's a=crypto)."""
    family = "IP6" if ":" in local_ip else "IP4"
    lines = [
        "v=0",
        f"o=duplex-agent {session_id} {version} IN {family} {local_ip}",
        "s=duplex-agent",
        f"c=IN {family} {local_ip}",
        "t=0 0",
    ]
    for index, media in enumerate(offer.media):
        if index != choice.index:
            lines.append(f"m={media.media} 0 {media.proto} {' '.join(media.formats)}")
            continue
        formats = [str(choice.payload_type)]
        if choice.dtmf_payload_type is not None:
            formats.append(str(choice.dtmf_payload_type))
        lines.append(f"m=audio {local_port} {choice.proto} {' '.join(formats)}")
        codec = choice.codec
        lines.append(f"a=rtpmap:{choice.payload_type} {codec.encoding}/{codec.rtp_clock}")
        if choice.dtmf_payload_type is not None:
            lines.append(f"a=rtpmap:{choice.dtmf_payload_type} {TELEPHONE_EVENT}/"
                         f"{codec.rtp_clock}")
            lines.append(f"a=fmtp:{choice.dtmf_payload_type} {choice.dtmf_fmtp or '0-16'}")
        lines.append("a=ptime:20")
        lines.extend(extra)
        lines.append(f"a={direction or choice.answer_direction}")
    return ("\r\n".join(lines) + "\r\n").encode("ascii", "replace")
