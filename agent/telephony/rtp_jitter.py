"""A small jitter buffer for inbound RTP, keyed by sequence number, played on the leg's clock.

Packets are held by (extended) sequence number and taken out one per 20 ms tick of the
leg's pacer, after a prefetch of `depth` packets. So the plugin sees a steady stream on the
agent's clock however the network bunched, delayed or reordered the packets (within the
depth), and a missing packet is known to be lost exactly when its turn comes: it is played
as a concealment of the one before. An empty buffer (the remote paused, or a long delay
spike) stops playout and prefetches again; a buffer that grew past `max_span` (the remote's
clock runs fast, or a burst) skips ahead so delay stays bounded.

What it holds is bounded between two ticks as well: at most `max_held` packets (twice the
span it plays from, and a few) and `max_held_bytes` of payload. A sender that floods it with
distinct sequence numbers has the oldest held packets dropped (counted as `overflow`), so
a leg never holds more than a few tens of KiB of inbound audio whatever arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEQ_MOD = 1 << 16
RESYNC_GAP = 250  # packets (5 s at 20 ms): a jump this far means the stream restarted
MAX_HELD_BYTES = 256 * 1024  # payload held at once, whatever the depth (a backstop)
HELD_SLACK = 8  # packets held beyond twice the span: a tick's worth of bunching


@dataclass
class JitterStats:
    received: int = 0
    played: int = 0
    reordered: int = 0  # arrived after a packet with a higher sequence number
    late: int = 0  # duplicates, or arrived after their turn had passed
    lost: int = 0  # turns with no packet while later ones were waiting (concealed)
    underruns: int = 0  # turns with an empty buffer after playout had started
    skipped: int = 0  # packets dropped to keep the delay bounded
    resyncs: int = 0
    overflow: int = 0  # dropped because the buffer held its limit of packets or bytes

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class JitterBuffer:
    def __init__(self, depth: int = 3, max_span: int | None = None,
                 max_held_bytes: int = MAX_HELD_BYTES) -> None:
        self.depth = max(1, depth)
        self.max_span = max_span if max_span is not None else 2 * self.depth + 2
        self.prefetch_ticks = self.depth  # the longest a first packet waits for `depth` more
        self.max_held_bytes = max_held_bytes
        self.stats = JitterStats()
        self._held: dict[int, bytes] = {}  # extended sequence number → payload, oldest first
        self.held_bytes = 0
        self._next: int | None = None  # extended sequence number whose turn is next
        self._highest: int | None = None
        self._playing = False
        self._prefetch_ticks = 0

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def max_held(self) -> int:
        """Packets held at most: twice the span playout keeps, and a tick's bunching."""
        return 2 * self.max_span + HELD_SLACK

    def reset(self) -> None:
        """Forget the stream (a new SSRC, or the leg ended); held packets are dropped."""
        self._held.clear()
        self.held_bytes = 0
        self._next = None
        self._highest = None
        self._playing = False
        self._prefetch_ticks = 0

    def _extend(self, seq: int) -> int:
        """16-bit sequence number → a monotonic extended one, near the highest seen."""
        if self._highest is None:
            return seq
        delta = (seq - self._highest) % SEQ_MOD
        if delta >= SEQ_MOD // 2:
            delta -= SEQ_MOD
        return self._highest + delta

    def push(self, seq: int, payload: bytes) -> None:
        self.stats.received += 1
        ext = self._extend(seq)
        if self._next is None or abs(ext - self._next) > RESYNC_GAP:
            if self._next is not None:
                self.stats.resyncs += 1
                self.reset()
            self._next = ext
        if ext < self._next:
            if self._playing:
                self.stats.late += 1
                return
            self._next = ext  # still prefetching: an earlier packet came in second
        if ext in self._held:
            self.stats.late += 1
            return
        if self._highest is not None and ext < self._highest:
            self.stats.reordered += 1
        if self._highest is None or ext > self._highest:
            self._highest = ext
        self._held[ext] = payload
        self.held_bytes += len(payload)
        self._bound()

    def _bound(self) -> None:
        """Drop the oldest held packets while over the packet or byte limit."""
        while len(self._held) > self.max_held or self.held_bytes > self.max_held_bytes:
            oldest = next(iter(self._held))
            self.held_bytes -= len(self._held.pop(oldest))
            self.stats.overflow += 1

    def pop(self) -> tuple[bool, bytes | None]:
        """This tick's packet: (False, None) nothing to play, (True, None) a lost packet to
        conceal, (True, payload) audio."""
        if self._next is None or self._highest is None:
            return False, None
        span = self._highest - self._next + 1
        if not self._playing:
            if not self._held:
                return False, None
            self._prefetch_ticks += 1
            if span < self.depth and self._prefetch_ticks < self.prefetch_ticks:
                return False, None
            self._playing = True
        if not self._held:
            self.stats.underruns += 1
            self._playing = False
            self._prefetch_ticks = 0
            self._next = self._highest + 1
            return False, None
        if span > self.max_span:
            self._next = self._skip(self._next, span - self.depth)
        payload = self._held.pop(self._next, None)
        self._next += 1
        if payload is None:
            self.stats.lost += 1
            return True, None
        self.held_bytes -= len(payload)
        self.stats.played += 1
        return True, payload

    def _skip(self, start: int, count: int) -> int:
        """Drop `count` sequence numbers from `start` on; the one whose turn is next after."""
        for seq in range(start, start + count):
            payload = self._held.pop(seq, None)
            if payload is not None:
                self.held_bytes -= len(payload)
                self.stats.skipped += 1
        return start + count


class Concealer:
    """Turns played payloads into PCM; a lost packet repeats the last one, fading out."""

    FADE = (0.5, 0.25)

    def __init__(self, samples_per_packet: int) -> None:
        self.samples_per_packet = samples_per_packet
        self._last: np.ndarray | None = None
        self._losses_in_a_row = 0

    def reset(self) -> None:
        """Forget the last packet (a new stream, or the leg ended)."""
        self._last = None
        self._losses_in_a_row = 0

    def fill(self, pcm: np.ndarray | None) -> np.ndarray:
        if pcm is not None:
            self._last = pcm
            self._losses_in_a_row = 0
            return pcm
        run = self._losses_in_a_row
        self._losses_in_a_row += 1
        if self._last is None or run >= len(self.FADE):
            length = len(self._last) if self._last is not None else self.samples_per_packet
            return np.zeros(length, dtype=np.int16)
        return (self._last.astype(np.float32) * self.FADE[run]).astype(np.int16)


class InboundTicks:
    """Plays packets of any duration out as exact ticks of `chunk_samples` samples.

    Carriers and PBXs send 10, 20, 30, 40 or 60 ms packets, and some senders (ffmpeg's
    default μ-law: 185-186 samples) not even a whole number of milliseconds, or change ptime
    mid-stream. Each tick takes packets from the jitter buffer only as far as the tick's
    samples need, so any packet duration plays at the rate it arrives; the buffer's depth
    follows the detected packet duration so its delay stays `depth_samples` of audio.
    """

    def __init__(self, buffer: JitterBuffer, concealer: Concealer, chunk_samples: int,
                 depth_samples: int) -> None:
        self.buffer = buffer
        self.concealer = concealer
        self.chunk_samples = chunk_samples
        self.depth_samples = depth_samples
        self.packet_samples: int | None = None  # the most common packet duration so far
        self._size_counts: dict[int, int] = {}
        self._pending = np.zeros(0, dtype=np.int16)

    @property
    def packet_sizes_seen(self) -> list[int]:
        return sorted(self._size_counts)

    def note_packet_samples(self, samples: int) -> None:
        """The duration of an arriving packet, so the buffer depth is held in time. The most
        common duration counts: a stream's odd last packet or one short packet says nothing."""
        if samples <= 0:
            return
        if samples == self.packet_samples:  # the usual packet: still the most common one
            self._size_counts[samples] += 1
            return
        if samples in self._size_counts or len(self._size_counts) < 32:
            self._size_counts[samples] = self._size_counts.get(samples, 0) + 1
        typical = max(self._size_counts, key=self._size_counts.__getitem__)
        if typical == self.packet_samples:
            return
        self.packet_samples = typical
        depth = max(1, -(-self.depth_samples // typical))
        self.buffer.depth = depth
        self.buffer.max_span = 2 * depth + 2
        self.buffer.prefetch_ticks = max(1, -(-self.depth_samples // self.chunk_samples))

    def tick(self, decode: Callable[[bytes], np.ndarray]) -> np.ndarray | None:
        """This tick's samples, or None while nothing is playing. A tick that runs out mid-way
        (an underrun) returns what there was."""
        if not len(self._pending):  # as a rule: one packet of one tick, played as it is
            play, payload = self.buffer.pop()
            if not play:
                return None
            pcm = self.concealer.fill(decode(payload) if payload is not None else None)
            if len(pcm) == self.chunk_samples:
                return pcm
            self._pending = pcm
        while len(self._pending) < self.chunk_samples:
            play, payload = self.buffer.pop()
            if not play:
                break
            pcm = self.concealer.fill(decode(payload) if payload is not None else None)
            self._pending = np.concatenate((self._pending, pcm))
        if len(self._pending) == 0:
            return None
        chunk = self.chunk_samples
        out, self._pending = self._pending[:chunk], self._pending[chunk:]
        return out

    def reset(self) -> None:
        """Drop everything held for the stream: packets, decoded samples, the last packet."""
        self.buffer.reset()
        self.concealer.reset()
        self._pending = np.zeros(0, dtype=np.int16)
