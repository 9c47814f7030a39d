"""Cheap checks on an SDP offer before aiortc sees it, so bad input gets a precise code."""

from __future__ import annotations

from agent.errors import CallError

MAX_SDP_BYTES = 64 * 1024
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")


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


def with_explicit_directions(sdp: str) -> str:
    """Give every media section a direction attribute (RFC 4566: a session-level one, else
    sendrecv, is the default). aiortc fails on a section without one (a 500 before this),
    and a malformed one (`a=direction:bogus`) is an unknown attribute, so it gets the default.
    """
    newline = "\r\n" if "\r\n" in sdp else "\n"
    lines = sdp.split(newline)
    trailing = [lines.pop()] if lines and lines[-1] == "" else []
    sections: list[list[str]] = [[]]
    for line in lines:
        if line.startswith("m="):
            sections.append([])
        sections[-1].append(line)
    default = next((line[2:] for line in sections[0] if line[2:] in DIRECTIONS), "sendrecv")
    for section in sections[1:]:
        if not any(line[2:] in DIRECTIONS for line in section if line.startswith("a=")):
            section.insert(1, f"a={default}")
    return newline.join([line for section in sections for line in section] + trailing)
