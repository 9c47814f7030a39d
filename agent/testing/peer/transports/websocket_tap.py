"""Text messages of an aiohttp client websocket taken as they arrive, without a task woken
for each one.

`async for message in ws` costs, per message, a future, a task wake-up and a pass of the
event loop on top of the read itself: about a third of what a media-stream call cost the
peer in a load test, where the agent's 50 `media` messages a second are only kept (with
their arrival times) and parsed after the call. aiohttp has no callback for a parsed
message, so this stands in for its frame parser on the connection: each chunk of bytes goes
to aiohttp's own parser (`WebSocketReader`, its C build where installed), and the text
messages that start with one of `prefixes` are taken off the message queue at once, with
the chunk's arrival time, through the queue's own `read()` (run in place: it does not wait
when a message is queued). The first message of any other kind (another event, a close, a
ping, an error, the end of the stream) stays queued and the tap hands over: `on_hand_over`
starts the ordinary receive loop, which then reads every message, that one first, as
without a tap.

Bytes read elsewhere (receive_poll.py) come through `deliver`. Once a read is seen to have
held whole frames only, all of them taken, aiohttp's parser is known to wait at a frame
boundary, and from then on the tap reads the frames it keeps from the bytes itself: a final
unmasked text frame of up to 64 KiB is its 2 or 4 header bytes and its payload (RFC 6455
5.2), a few slices instead of the parser, a message object, the queue and its `read()`. The
first frame of another kind, and all after it, go to aiohttp's parser from that frame's
start; a frame split over two reads is held until the second.

Private aiohttp attributes are read here (the connection's protocol and its parser slot,
the queue's buffer), which is why `install` checks each one and returns None where they are
not as expected (another aiohttp version): the caller then receives with `async for`, at the
usual cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp

_TEXT = aiohttp.WSMsgType.TEXT


class WebsocketTap:
    def __init__(self, protocol: Any, parser: Any, queue: Any, prefixes: tuple[str, ...],
                 take: Callable[[float, str], None], on_hand_over: Callable[[], None]) -> None:
        self._protocol = protocol
        self._parser = parser
        self._queue = queue
        self._buffer = queue._buffer
        self._keep_prefixes = prefixes
        self._prefixes = tuple(prefix.encode() for prefix in prefixes)
        self._aligned = False  # aiohttp's parser known to wait at a frame boundary
        self._held = b""  # the start of a frame that the next read completes
        self._take = take
        self._on_hand_over = on_hand_over
        self.active = True
        self.taken = 0
        self.arrival: float | None = None
        # Told when one read held more than one kept message (they share its arrival time).
        self.on_burst: Callable[[], None] | None = None

    @classmethod
    def install(cls, socket: aiohttp.ClientWebSocketResponse, prefixes: tuple[str, ...],
                take: Callable[[float, str], None],
                on_hand_over: Callable[[], None]) -> WebsocketTap | None:
        """Put a tap between the connection and aiohttp's parser of `socket` (nothing may be
        reading the socket yet) that keeps the text messages starting with one of
        `prefixes`; None where aiohttp's internals are not as expected."""
        queue: Any = getattr(socket, "_reader", None)
        protocol: Any = getattr(queue, "_protocol", None)
        parser: Any = getattr(protocol, "_payload_parser", None)
        buffer: Any = getattr(queue, "_buffer", None)
        if (queue is None or parser is None or getattr(protocol, "_payload", None) is not queue
                or not hasattr(buffer, "__len__") or not hasattr(buffer, "__getitem__")
                or not callable(getattr(queue, "read", None))
                or not callable(getattr(queue, "is_eof", None))
                or not callable(getattr(parser, "feed_data", None))
                or not callable(getattr(parser, "feed_eof", None))):
            return None
        tap = cls(protocol, parser, queue, prefixes, take, on_hand_over)
        protocol._payload_parser = tap
        tap._take_queued(time.monotonic())  # what came with the handshake's response
        return tap

    # -- the parser's place on the connection ---------------------------------------------

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        arrived = self.arrival if self.arrival is not None else time.monotonic()
        result: tuple[bool, bytes] = self._parser.feed_data(data)
        if self.active:
            self._take_queued(arrived)
        return result

    def feed_eof(self) -> None:
        self._parser.feed_eof()
        self.hand_over()

    @property
    def transport(self) -> Any:
        """The connection's transport (None once it is gone)."""
        return getattr(self._protocol, "transport", None)

    def deliver(self, data: bytes, arrived: float) -> bool:
        """Bytes read off the connection elsewhere (receive_poll.py), which arrived at
        `arrived`; False once the tap has handed over (the transport should read again).

        Once the parser is known to wait at a frame boundary, whole frames the tap keeps
        are taken from the bytes directly (`_take_frames`); the rest, from the first frame
        it does not keep, goes to the connection's protocol as the transport would hand it.
        """
        taken = self.taken
        try:
            if self._held:
                data, self._held = self._held + data, b""
            if self._aligned and self.active:
                start = self._take_frames(data, arrived)
                if start == len(data):
                    return True
                data = data[start:]
                self._aligned = False  # aiohttp's parser reads on from a frame's start
            return self._to_protocol(data, arrived)
        finally:
            if self.taken - taken > 1 and self.on_burst is not None:
                self.on_burst()

    def _to_protocol(self, data: bytes, arrived: float) -> bool:
        """Through aiohttp's protocol and parser; where the parser gave exactly the frames
        that `data` holds whole, it waits at a boundary now (and did before)."""
        taken = self.taken
        self.arrival = arrived
        try:
            self._protocol.data_received(data)
        finally:
            self.arrival = None
        if self.active and not self._aligned:
            frames, end = _whole_frames(data)
            self._aligned = end == len(data) and frames == self.taken - taken > 0
        return self.active

    def _take_frames(self, data: bytes, arrived: float) -> int:
        """Take the whole unfragmented text frames that are kept from the start of `data`;
        an incomplete frame at the end is held for the next read. Returns where the first
        frame not taken starts (len(data): all taken or held)."""
        position, size = 0, len(data)
        while position < size:
            frame = _frame_at(data, position)
            if frame is None:  # incomplete: the rest comes with the next read
                self._held = data[position:]
                return size
            start, end = frame
            if start < 0 or not data.startswith(self._prefixes, start, end):
                return position
            try:
                text = data[start:end].decode("utf-8")
            except UnicodeDecodeError:
                return position  # aiohttp's parser says what is wrong with it
            self.taken += 1
            self._take(arrived, text)
            position = end
        return position

    # -- taking messages ------------------------------------------------------------------

    def _take_queued(self, arrived: float) -> None:
        buffer = self._buffer
        while self.active and buffer:
            message = buffer[0][0]
            data = message.data
            if (message.type is not _TEXT or not isinstance(data, str)
                    or not data.startswith(self._keep_prefixes)):
                self.hand_over()
                return
            self._read_one()
            self.taken += 1
            self._take(arrived, data)
        if self.active and self._queue.is_eof():  # an error or the end: the reader says which
            self.hand_over()

    def _read_one(self) -> None:
        """The first queued message off the queue, by its own `read()` (it keeps the queue's
        accounting), which returns at once while a message is queued."""
        reading = self._queue.read()
        try:
            reading.send(None)
        except StopIteration:
            return
        reading.close()
        raise RuntimeError("the websocket queue had no message to read")

    def hand_over(self) -> None:
        """From now on every message is left to the receive loop (once; also for closing)."""
        if not self.active:
            return
        self.active = False
        if self._protocol._payload_parser is self:
            self._protocol._payload_parser = self._parser
        self._on_hand_over()

    def detach(self) -> None:
        """Give the parser its place back without starting the receive loop (closing)."""
        if self.active:
            self.active = False
            if self._protocol._payload_parser is self:
                self._protocol._payload_parser = self._parser
        if self._held:  # the start of a frame the parser reads on from
            held, self._held = self._held, b""
            self._protocol.data_received(held)


def _frame_at(data: bytes, position: int) -> tuple[int, int] | None:
    """Where the payload of the frame at `position` starts and ends (RFC 6455 5.2); a start
    of -1 for a frame the fast path leaves to aiohttp (not a final unmasked uncompressed text
    frame, or a 64-bit length); None where the frame is not whole yet."""
    size = len(data)
    if size - position < 2:
        return None
    first, second = data[position], data[position + 1]
    if first != 0x81 or second & 0x80:  # FIN + text, no RSV bits; a server does not mask
        return -1, position
    length, start = second, position + 2
    if length == 126:
        if size - position < 4:
            return None
        length, start = int.from_bytes(data[position + 2:position + 4], "big"), position + 4
    elif length == 127:
        return -1, position
    end = start + length
    return (start, end) if end <= size else None


def _whole_frames(data: bytes) -> tuple[int, int]:
    """How many whole frames of any kind `data` starts with, and where they end."""
    count, position = 0, 0
    while position < len(data):
        size = len(data)
        if size - position < 2:
            break
        second = data[position + 1]
        length, start = second & 0x7F, position + 2 + (4 if second & 0x80 else 0)
        if length == 126:
            if size - position < 4:
                break
            length = int.from_bytes(data[position + 2:position + 4], "big")
            start += 2
        elif length == 127:
            if size - position < 10:
                break
            length = int.from_bytes(data[position + 2:position + 10], "big")
            start += 8
        if start + length > size:
            break
        count, position = count + 1, start + length
    return count, position
