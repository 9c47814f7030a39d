"""Trickled ICE candidates (`application/trickle-ice-sdpfrag`, RFC 8840 / RFC 9725).

A fragment carries the ICE credentials and, per media section (`m=` + `a=mid:`), candidate
lines and an optional `a=end-of-candidates`. Credentials different from the ones in the
offer mean an ICE restart, which aiortc cannot do (RFC 9725: answer 422).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiortc import RTCIceCandidate, RTCPeerConnection
from aiortc.sdp import candidate_from_sdp

from agent.errors import AgentError

MAX_CANDIDATES = 64


class TrickleError(AgentError):
    """A trickled ICE fragment that cannot be applied."""


@dataclass
class SdpFragment:
    ice_ufrag: str | None = None
    ice_pwd: str | None = None
    candidates: list[RTCIceCandidate] = field(default_factory=list)
    ended_mids: list[str] = field(default_factory=list)


def _candidate(value: str, mid: str | None, index: int) -> RTCIceCandidate:
    try:
        candidate = candidate_from_sdp(value)
    except (AssertionError, ValueError, IndexError):
        raise TrickleError("invalid_candidate", f"bad candidate line: {value[:80]!r}") from None
    if candidate.component not in (1, 2) or not 0 < candidate.port < 65536:
        raise TrickleError("invalid_candidate", f"bad candidate line: {value[:80]!r}")
    candidate.sdpMid = mid
    candidate.sdpMLineIndex = index
    return candidate


def parse_sdpfrag(text: str) -> SdpFragment:
    fragment = SdpFragment()
    mid: str | None = None
    index = -1
    pending: list[str] = []  # candidate lines of the current section until its mid is known
    ended = False

    def flush() -> None:
        nonlocal ended
        for line in pending:
            fragment.candidates.append(_candidate(line, mid, index))
        if ended and mid is not None:
            fragment.ended_mids.append(mid)
        pending.clear()
        ended = False

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("m="):
            flush()
            index += 1
            mid = None
        elif line.startswith("a=mid:"):
            mid = line[len("a=mid:"):]
        elif line.startswith("a=ice-ufrag:"):
            fragment.ice_ufrag = line[len("a=ice-ufrag:"):]
        elif line.startswith("a=ice-pwd:"):
            fragment.ice_pwd = line[len("a=ice-pwd:"):]
        elif line.startswith("a=candidate:"):
            if index < 0:
                raise TrickleError("invalid_sdpfrag", "a candidate before any m= line")
            pending.append(line[len("a=candidate:"):])
        elif line == "a=end-of-candidates":
            ended = True
        elif line.startswith(("a=", "m=")):
            continue  # other attributes (ice-options, group) carry nothing to apply here
        else:
            raise TrickleError("invalid_sdpfrag", f"not an SDP fragment line: {line[:80]!r}")
        if len(fragment.candidates) + len(pending) > MAX_CANDIDATES:
            raise TrickleError("too_many_candidates",
                               f"at most {MAX_CANDIDATES} candidates per request")
    flush()
    return fragment


def remote_ice_ufrags(sdp: str) -> set[str]:
    return {
        line.strip()[len("a=ice-ufrag:"):] for line in sdp.splitlines()
        if line.strip().startswith("a=ice-ufrag:")
    }


def known_mids(sdp: str) -> list[str]:
    return [
        line.strip()[len("a=mid:"):] for line in sdp.splitlines()
        if line.strip().startswith("a=mid:")
    ]


async def apply_sdpfrag(pc: RTCPeerConnection, fragment: SdpFragment) -> int:
    """Add the fragment's candidates to `pc`; returns how many were added."""
    remote = pc.remoteDescription
    if remote is None:
        raise TrickleError("no_remote_description", "the call has no offer yet", status=409)
    ufrags = remote_ice_ufrags(remote.sdp)
    if fragment.ice_ufrag is not None and fragment.ice_ufrag not in ufrags:
        raise TrickleError("ice_restart_unsupported",
                           "ICE restarts are not supported; start a new call", status=422)
    mids = known_mids(remote.sdp)
    for candidate in fragment.candidates:
        if candidate.sdpMid is not None and candidate.sdpMid not in mids:
            raise TrickleError("unknown_mid", f"no media section with mid {candidate.sdpMid!r}")
        if candidate.sdpMid is None and not 0 <= (candidate.sdpMLineIndex or 0) < len(mids):
            raise TrickleError("unknown_mid", "a candidate names no known media section")
    for candidate in fragment.candidates:
        try:
            await pc.addIceCandidate(candidate)
        except ValueError:
            # aioice refuses candidates after end-of-candidates; so does the standard.
            raise TrickleError("candidates_ended",
                               "end-of-candidates was already signalled") from None
    if fragment.ended_mids:
        await pc.addIceCandidate(None)
    return len(fragment.candidates)
