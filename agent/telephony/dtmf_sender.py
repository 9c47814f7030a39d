"""RFC 4733 telephone-events sent: keypad digits played into a leg's own RTP stream.

The RTP leg asks `next_packet` on each of its packet ticks. While a digit is due, that tick
carries a telephone-event packet instead of audio, on the stream's own SSRC and sequence:
every packet of one event has the event's start timestamp, the marker bit on its first, a
duration growing by one packet time per tick up to the tone length, then the end packet
(E bit, final duration) sent three times. A gap of audio follows before the next digit. The
stream's timestamp keeps advancing under the events, as the media clock does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from agent.telephony.telephone_event import EVENT_DIGITS, telephone_event_payload

TONE_MS = 100
GAP_MS = 50
END_REPEATS = 3
MAX_DIGITS = 32  # in one request
MAX_QUEUED = 64  # waiting on one leg
VOLUME = 10  # -dBm0


def check_digits(digits: object) -> str:
    """The digits to send, upper-cased; ValueError for anything but 1-32 of 0-9 * # A-D."""
    if not isinstance(digits, str) or not 1 <= len(digits) <= MAX_DIGITS:
        raise ValueError(f"'digits' must be a string of 1 to {MAX_DIGITS} keypad digits")
    digits = digits.upper()
    wrong = sorted({d for d in digits if d not in EVENT_DIGITS})
    if wrong:
        raise ValueError(f"'digits' may hold only 0-9, *, #, A-D, not {''.join(wrong)!r}")
    return digits


@dataclass(frozen=True)
class EventPacket:
    payload: bytes
    timestamp: int  # the event's start: the same for all its packets
    marker: bool  # the first packet of an event


class DtmfSender:
    """Digits waiting to be sent on one RTP stream, and the one being sent."""

    def __init__(self, samples_per_packet: int, clock_rate: int = 8000) -> None:
        self.samples_per_packet = samples_per_packet
        self.tone_samples = clock_rate * TONE_MS // 1000
        packet_ms = 1000 * samples_per_packet / clock_rate
        self.gap_ticks = max(1, -(-GAP_MS // max(1, int(packet_ms))))  # ceil
        self.queue: deque[str] = deque()
        self.sent = 0  # digits finished
        self._digit: str | None = None
        self._start = 0
        self._duration = 0
        self._ends_left = 0
        self._gap_left = 0
        self._first = False

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self._digit is not None or self._gap_left > 0

    @property
    def pending(self) -> int:
        return len(self.queue) + (self._digit is not None)

    def add(self, digits: str) -> None:
        """Queue checked digits (check_digits); ValueError past MAX_QUEUED waiting."""
        if self.pending + len(digits) > MAX_QUEUED:
            raise ValueError(f"at most {MAX_QUEUED} digits may wait on one call")
        self.queue.extend(digits)

    def next_packet(self, timestamp: int) -> EventPacket | None:
        """What this tick sends: an event packet, or None for audio. `timestamp` is the
        stream's timestamp for this tick."""
        if self._digit is None:
            if self._gap_left > 0:
                self._gap_left -= 1
                return None
            if not self.queue:
                return None
            self._digit = self.queue.popleft()
            self._start = timestamp
            self._duration = 0
            self._ends_left = END_REPEATS
            self._first = True
        digit = self._digit
        if self._duration < self.tone_samples:
            self._duration = min(self._duration + self.samples_per_packet, self.tone_samples)
        end = self._duration >= self.tone_samples
        if end:
            self._ends_left -= 1
            if self._ends_left <= 0:
                self._digit = None
                self._gap_left = self.gap_ticks
                self.sent += 1
        packet = EventPacket(
            telephone_event_payload(digit, end=end, duration=self._duration, volume=VOLUME),
            self._start, self._first)
        self._first = False
        return packet

    def clear(self) -> None:
        self.queue.clear()
