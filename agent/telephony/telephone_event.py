"""RFC 4733 telephone-events: keypad digits carried inside an RTP stream.

A key press is sent as several packets sharing one RTP timestamp (the event's start): updates
while the key is held, then an end packet repeated up to three times. A digit is reported
once, on the first packet of a new event, so it reaches the model without waiting for the
key to be released; the repeats and updates are recognised by their timestamp (the last few
are remembered, so a reordered packet of an earlier press is not taken for a new one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

EVENT_DIGITS = "0123456789*#ABCD"  # event codes 0-15 (RFC 4733 section 3.2)
DEFAULT_PAYLOAD_TYPE = 101  # what Asterisk, FreeSWITCH and most SIP stacks offer


@dataclass(frozen=True)
class TelephoneEvent:
    digit: str
    end: bool
    volume: int  # -dBm0, 0-63
    duration: int  # in RTP timestamp units


def parse_telephone_event(payload: bytes) -> TelephoneEvent | None:
    """The event in a payload, or None for one that is too short or not a keypad digit
    (flash, modem tones and other named events are not passed on)."""
    if len(payload) < 4 or payload[0] >= len(EVENT_DIGITS):
        return None
    return TelephoneEvent(
        digit=EVENT_DIGITS[payload[0]],
        end=bool(payload[1] & 0x80),
        volume=payload[1] & 0x3F,
        duration=int.from_bytes(payload[2:4], "big"),
    )


class TelephoneEventDetector:
    """Turns a stream of telephone-event packets into one digit per key press."""

    def __init__(self) -> None:
        self._recent_timestamps: deque[int] = deque(maxlen=8)
        self.packets = 0
        self.ignored = 0

    def feed(self, timestamp: int, payload: bytes) -> str | None:
        """The digit this packet starts, or None (a repeat, an update, or not a digit)."""
        self.packets += 1
        event = parse_telephone_event(payload)
        if event is None:
            self.ignored += 1
            return None
        if timestamp in self._recent_timestamps:
            return None
        self._recent_timestamps.append(timestamp)
        return event.digit


def telephone_event_payload(digit: str, *, end: bool, duration: int, volume: int = 10) -> bytes:
    """One telephone-event payload: what a PBX sends (used by tests and test tools)."""
    return bytes([EVENT_DIGITS.index(digit), (0x80 if end else 0) | (volume & 0x3F)]) + (
        duration & 0xFFFF).to_bytes(2, "big")
