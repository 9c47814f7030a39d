"""Cheap checks on an SDP offer before aiortc sees it, so bad input gets a precise code."""

from __future__ import annotations

from .errors import CallError

MAX_SDP_BYTES = 64 * 1024


def media_kinds(sdp: str) -> list[str]:
    return [line[2:].split(" ", 1)[0] for line in sdp.splitlines() if line.startswith("m=")]


def check_offer_sdp(sdp: object) -> str:
    if not isinstance(sdp, str) or not sdp.strip():
        raise CallError("invalid_sdp", "'sdp' must be a non-empty string", param="sdp")
    if len(sdp.encode("utf-8", "replace")) > MAX_SDP_BYTES:
        raise CallError("invalid_sdp", "the SDP is larger than 64 KiB", param="sdp")
    if not sdp.lstrip().startswith("v=0"):
        raise CallError("invalid_sdp", "the SDP must start with 'v=0'", param="sdp")
    kinds = media_kinds(sdp)
    if "audio" not in kinds:
        raise CallError("no_audio", "the offer has no audio m-line", param="sdp")
    return sdp
