"""Settings aiortc does not expose, applied to its objects after they are built.

Kept in one place so an aiortc upgrade that renames these internals breaks one module.
"""

from __future__ import annotations

import logging

from aiortc import RTCRtpReceiver, RTCRtpTransceiver
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

log = logging.getLogger(__name__)

JITTER_CAPACITY = 16  # packets; a power of two, as aiortc requires


def set_audio_jitter_prefetch(receiver: RTCRtpReceiver, packets: int) -> None:
    """Audio leaves aiortc's jitter buffer once `packets` later packets have arrived.

    aiortc fixes this at 4 (about 80 ms of delay). On a clean link 1 is enough; lossy or
    jittery links want more. 0 behaves like 1 (a frame is complete when the next arrives).
    """
    attribute = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, attribute):
        log.warning("aiortc internals changed: jitter buffer depth not applied")
        return
    setattr(receiver, attribute, JitterBuffer(capacity=JITTER_CAPACITY, prefetch=packets))


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


def negotiated_codecs(transceiver: RTCRtpTransceiver) -> list[RTCRtpCodecParameters]:
    return list(getattr(transceiver, "_codecs", []))


def restrict_codecs(transceiver: RTCRtpTransceiver, allowed: list[str]) -> list[str]:
    """Answer with the agent's first choice among the offered codecs that are `allowed`
    (e.g. ["opus", "PCMU"], in the agent's preference order), and only that one.

    One codec in the answer makes both directions use it: an aiortc offerer otherwise sends
    with its own first preference among the answered codecs (a PCMU-first caller would send
    PCMU while the agent sends Opus). Must run after setRemoteDescription and before
    createAnswer. Returns what is left (empty: no common codec).
    """
    order = [name.lower() for name in allowed]
    codecs = [
        codec for codec in negotiated_codecs(transceiver)
        if codec.mimeType.split("/")[-1].lower() in order
    ]
    codecs.sort(key=lambda codec: order.index(codec.mimeType.split("/")[-1].lower()))
    codecs = codecs[:1]
    transceiver._codecs = codecs  # type: ignore[attr-defined]
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
