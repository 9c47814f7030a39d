"""Data-channel messages over the advertised size are dropped while they arrive, not after.

aiortc advertises `a=max-message-size:262144` and reassembles a whole SCTP message before
anything can look at it, so a client that ignores the advertised size makes the server buffer
all of it (a 16 MB message cost 19 MB of RSS and late ticks) before the 64 KiB event check
runs. Here the agent advertises its own limit and, on the receive side, empties every fragment
of a message once the message has grown past it. The chunks themselves stay where aiortc
keeps them, so its TSN, SACK, receive-window and ordered-delivery bookkeeping is untouched;
the emptied message then reaches its channel as an `OVERSIZED_EVENT` instead of a "message".
An empty reassembled message cannot be a real one: RFC 8831 sends an empty message as one
zero byte with its own PPID.

aiortc internals used (checked by `missing_internals`): `RTCSctpTransport._receive_data_chunk`,
`_mark_received`, `_get_inbound_stream`, `_advertised_rwnd`, `_sack_needed`, `_receive`,
`_reset_deferred_streams`, `_data_channels`, and `InboundStream.reassembly/sequence_number`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    DataChunk,
    InboundStream,
    RTCSctpCapabilities,
    RTCSctpTransport,
)
from aiortc.utils import uint16_gt

from agent.realtime.events import MAX_CLIENT_EVENT_BYTES

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = MAX_CLIENT_EVENT_BYTES  # an event is one message
OVERSIZED_EVENT = "oversized"  # emitted on an RTCDataChannel instead of "message"
INTERNALS = ("_receive_data_chunk", "_mark_received", "_get_inbound_stream", "_receive",
             "_reset_deferred_streams")

ReceiveChunk = Callable[[RTCSctpTransport, DataChunk], Coroutine[Any, Any, None]]
_original_receive: ReceiveChunk | None = None


def is_ordered(chunk: DataChunk) -> bool:
    return not chunk.flags & SCTP_DATA_UNORDERED


def message_fragments(stream: InboundStream, chunk: DataChunk) -> list[DataChunk]:
    """The fragments of `chunk`'s message that are in the reassembly buffer so far.

    Ordered fragments share their stream sequence number. Unordered ones are told apart only
    by their first/last flags: a run from a first fragment to a last one, across any TSNs
    still missing (a sender puts one message's fragments on consecutive TSNs, so a gap is a
    fragment still to come). Only when the last fragment of one message and the first of
    the next are both missing do the two count as one.
    """
    if is_ordered(chunk):
        return [c for c in stream.reassembly if is_ordered(c) and c.stream_seq == chunk.stream_seq]
    buffered = stream.reassembly
    at = next(i for i, c in enumerate(buffered) if c is chunk)
    start = at
    while (start > 0 and not buffered[start].flags & SCTP_DATA_FIRST_FRAG
           and not is_ordered(buffered[start - 1])
           and not buffered[start - 1].flags & SCTP_DATA_LAST_FRAG):
        start -= 1
    end = at
    while (end + 1 < len(buffered) and not buffered[end].flags & SCTP_DATA_LAST_FRAG
           and not is_ordered(buffered[end + 1])
           and not buffered[end + 1].flags & SCTP_DATA_FIRST_FRAG):
        end += 1
    return buffered[start:end + 1]


def limit_message(stream: InboundStream, chunk: DataChunk, limit: int,
                  discarding: set[int]) -> int:
    """Empty the fragments of `chunk`'s message if it is over `limit`; return bytes freed.

    `discarding` holds the stream sequence numbers of ordered messages being dropped, so
    their later fragments are emptied on arrival; an unordered message being dropped is
    recognised by an emptied neighbour in its run.
    """
    fragments = message_fragments(stream, chunk)
    size = sum(len(c.user_data) for c in fragments)
    dropping = size > limit or (not is_ordered(chunk)
                                and any(not c.user_data for c in fragments))
    if not dropping:
        return 0
    for fragment in fragments:
        fragment.user_data = b""
    if is_ordered(chunk):
        discarding.add(chunk.stream_seq)
    return size


def collapse_dropped(stream: InboundStream) -> None:
    """Fold the fragments of each dropped message, as far as they are contiguous from its
    first one, into that first fragment (its TSN becomes the last one folded in).

    aiortc's reassembly then sees the same message it would have seen whole, at the same
    TSNs, but holds one chunk for it instead of one per 1,160 bytes: a 16 MB message would
    otherwise keep 14,000 empty chunks that aiortc walks on every arrival. Only a first
    fragment takes others in, so a fragment still to come always finds its neighbour.
    """
    kept: list[DataChunk] = []
    for chunk in stream.reassembly:
        head = kept[-1] if kept else None
        if (head is not None and not head.user_data and not chunk.user_data
                and head.flags & SCTP_DATA_FIRST_FRAG and not head.flags & SCTP_DATA_LAST_FRAG
                and not chunk.flags & SCTP_DATA_FIRST_FRAG
                and is_ordered(head) == is_ordered(chunk)
                and chunk.tsn == (head.tsn + 1) % 2**32):
            head.tsn = chunk.tsn
            head.flags |= chunk.flags & SCTP_DATA_LAST_FRAG
            continue
        kept.append(chunk)
    stream.reassembly = kept


async def receive_data_chunk_bounded(self: RTCSctpTransport, chunk: DataChunk) -> None:
    """aiortc's DATA chunk handling, with each message held to `MAX_MESSAGE_BYTES`."""
    self._sack_needed = True
    if self._mark_received(chunk.tsn):
        return
    stream = self._get_inbound_stream(chunk.stream_id)
    discarding: set[int] = stream.__dict__.setdefault("agent_discarding", set())
    known_dropped = is_ordered(chunk) and chunk.stream_seq in discarding
    if known_dropped:
        chunk.user_data = b""
    stream.add_chunk(chunk)
    self._advertised_rwnd -= len(chunk.user_data)
    whole = chunk.flags & SCTP_DATA_FIRST_FRAG and chunk.flags & SCTP_DATA_LAST_FRAG
    if not known_dropped and (not whole or len(chunk.user_data) > MAX_MESSAGE_BYTES):
        self._advertised_rwnd += limit_message(stream, chunk, MAX_MESSAGE_BYTES, discarding)
    if not chunk.user_data:
        collapse_dropped(stream)
    for stream_id, pp_id, data in stream.pop_messages():
        self._advertised_rwnd += len(data)
        if data:
            await self._receive(stream_id, pp_id, data)
            continue
        # Ordered messages are delivered in sequence: every number before the stream's
        # next one is done with.
        discarding -= {seq for seq in discarding if uint16_gt(stream.sequence_number, seq)}
        channel = self._data_channels.get(stream_id)
        log.warning("data channel %s: a message over %d bytes was dropped",
                    getattr(channel, "label", stream_id), MAX_MESSAGE_BYTES)
        if channel is not None:
            channel.emit(OVERSIZED_EVENT)
    await self._reset_deferred_streams()


def agent_capabilities(cls: type[RTCSctpTransport]) -> RTCSctpCapabilities:
    return RTCSctpCapabilities(maxMessageSize=MAX_MESSAGE_BYTES)


def limit_data_channel_messages() -> bool:
    """Advertise and enforce `MAX_MESSAGE_BYTES` on every data channel (process-wide,
    idempotent). Returns False, leaving aiortc as it is, when its internals changed."""
    global _original_receive
    if _original_receive is not None:
        return True
    if missing_sctp_internals():
        log.warning("aiortc internals changed: data-channel messages are reassembled whole "
                    "before the %d-byte limit applies", MAX_MESSAGE_BYTES)
        return False
    _original_receive = RTCSctpTransport._receive_data_chunk
    # (deliberate patches of aiortc's methods: mypy forbids assigning to methods)
    RTCSctpTransport._receive_data_chunk = receive_data_chunk_bounded  # type: ignore[method-assign]
    RTCSctpTransport.getCapabilities = classmethod(  # type: ignore[method-assign,assignment]
        agent_capabilities)
    return True


def missing_sctp_internals() -> list[str]:
    missing = [f"RTCSctpTransport.{name}" for name in INTERNALS
               if not hasattr(RTCSctpTransport, name)]
    probe = InboundStream()
    for name in ("reassembly", "sequence_number", "add_chunk", "pop_messages"):
        if not hasattr(probe, name):
            missing.append(f"InboundStream.{name}")
    return missing
