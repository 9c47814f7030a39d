"""RFC 4733 telephone-events (DTMF digits in RTP) for the peer's RTP and SIP transports.

Written here rather than imported from the agent: the peer is a client of the public
protocols and the layering keeps agent.testing off agent.telephony. The format is four bytes
(event, end bit and volume, duration), small enough that no library is worth pulling in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

DIGITS = "0123456789*#ABCD"
DEFAULT_PAYLOAD_TYPE = 101
TONE_PACKETS = 5  # 100 ms of tone in 20 ms packets
END_PACKETS = 3  # the end packet is sent three times (RFC 4733 section 2.5.1.4)
PAUSE_PACKETS = 3  # 60 ms between digits
VOLUME = 10  # -10 dBm0


def check_digits(digits: str) -> str:
    upper = digits.upper()
    for digit in upper:
        if digit not in DIGITS:
            raise ValueError(f"{digit!r} is not a DTMF digit (0-9, *, #, A-D)")
    if not upper:
        raise ValueError("no DTMF digits given")
    return upper


def event_payload(digit: str, *, end: bool, duration: int) -> bytes:
    flags = (0x80 if end else 0) | VOLUME
    return struct.pack("!BBH", DIGITS.index(digit), flags, min(duration, 0xFFFF))


@dataclass
class TelephoneEvent:
    digit: str
    end: bool
    duration: int


def parse_event(payload: bytes) -> TelephoneEvent | None:
    if len(payload) < 4:
        return None
    event, flags, duration = struct.unpack("!BBH", payload[:4])
    if event >= len(DIGITS):
        return None
    return TelephoneEvent(DIGITS[event], bool(flags & 0x80), duration)


class DigitDetector:
    """One digit per event (RTP timestamp), reported on its first packet."""

    def __init__(self) -> None:
        self._last_timestamp: int | None = None

    def feed(self, timestamp: int, payload: bytes) -> str | None:
        event = parse_event(payload)
        if event is None or timestamp == self._last_timestamp:
            return None
        self._last_timestamp = timestamp
        return event.digit


def digit_packets(digit: str, samples_per_packet: int) -> list[tuple[bytes, bool]]:
    """(payload, marker) for one digit: the tone's packets, then the end packet three times."""
    packets = [(event_payload(digit, end=False, duration=samples_per_packet * (i + 1)), i == 0)
               for i in range(TONE_PACKETS)]
    final = event_payload(digit, end=True, duration=samples_per_packet * TONE_PACKETS)
    packets += [(final, False)] * END_PACKETS
    return packets
