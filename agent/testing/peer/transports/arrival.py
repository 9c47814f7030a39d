"""When data reached this host: the kernel's receive time of what a socket read returns
(Linux `SO_TIMESTAMPNS`), on the monotonic clock every measurement of a call uses.

In load-test mode the peer reads its sockets on a shared tick or poll rather than as data
comes (transports/rtp_stream.py, direct_srtp.py, receive_poll.py); the kernel stamps each
packet when it arrives, so jitter, gaps and first audio still see when it came, not when it
was read. Python's socket module does not name the option. Where there is no stamp (another
system, or the first packets before the kernel has turned stamping on, which it does a moment
after a socket asks), the time of the read stands in.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Iterable

# Linux's SO_TIMESTAMPNS (asm-generic/socket.h).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
TIMESPEC = struct.Struct("@qq")  # struct timespec of an SO_TIMESTAMPNS control message
ANCILLARY_BYTES = socket.CMSG_SPACE(TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0

Ancillary = Iterable[tuple[int, int, bytes]]


def stamp_arrivals(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what `sock` receives; False where it cannot."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def wall_offset() -> float:
    """The wall clock minus the monotonic one, taken once per batch of reads."""
    return time.time() - time.monotonic()


def arrival(ancillary: Ancillary, offset: float) -> float:
    """The monotonic arrival time in a read's control messages (`offset`: `wall_offset()`),
    or now where the kernel gave none."""
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            seconds, nanoseconds = TIMESPEC.unpack_from(value)
            return seconds + nanoseconds * 1e-9 - offset
    return time.monotonic()
