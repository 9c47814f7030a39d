"""Sending RTP only to a remote that has shown itself (symmetric RTP as a reflection guard).

A leg whose remote address came from a peer's own words (a SIP offer's `c=`/`m=` lines)
cannot tell whether anything there wants its audio: an INVITE naming a third host would
otherwise aim 50 packets a second at it, about 170 KB for one 600-byte datagram. Until the
remote is confirmed the leg sends at most a short burst (`UNHEARD_BURST` packets, enough for
a peer that only echoes what it hears to start echoing) and then withholds its packets.

The remote is confirmed by its first RTP packet (the leg hears it), or by the signaling
layer when the address is one it has verified otherwise (the host the call's ACK came
from). A new remote on another host starts unconfirmed again with a fresh burst; on the same
host (a peer moving its port) it stays confirmed.
"""

from __future__ import annotations

from typing import Any

UNHEARD_BURST = 10  # packets (200 ms of 20 ms audio) sent before the remote is heard


class RemoteCheck:
    def __init__(self, burst: int = UNHEARD_BURST) -> None:
        self.burst = burst
        self.left = burst
        self.confirmed = False
        self.host: str | None = None  # the host the confirmation is for
        self.withheld = 0  # packets not sent to an unconfirmed remote

    def may_send(self) -> bool:
        """Whether one more packet may go to the remote (a packet of the burst is used)."""
        if self.confirmed:
            return True
        if self.left > 0:
            self.left -= 1
            return True
        self.withheld += 1
        return False

    def confirm(self, host: str) -> None:
        """`host` sent RTP, or the signaling layer vouches for it."""
        self.confirmed = True
        self.host = host

    def moved(self, host: str) -> None:
        """The remote is now on `host`: unconfirmed again unless that is the confirmed one."""
        if self.confirmed and host == self.host:
            return
        self.confirmed = False
        self.host = None
        self.left = self.burst

    def stats(self) -> dict[str, Any]:
        return {"remote_confirmed": self.confirmed, "packets_withheld": self.withheld}
