"""Why a call ended: the one list of end reasons.

Every place that says why a call ended takes its word from here: the `agent_calls_ended_total`
metric's `reason` label, the sideband's and data channel's `call.ending`, the
`realtime.call.ended` webhook, the `reason` of `GET /v1/sip/calls/{id}` and its `call.ended`
event, and the text of the SIP `Reason` header on the BYE. `EndReason` is a `str` enum, so its
values are the very strings on the wire; docs/operations.md tables them all and
tests/core/test_end_reason.py checks that table against this enum both ways.

Besides these, a call that ends because of a coded error ends with that error's `code`
(`Ending` below): a plugin that says the session cannot go on (`upstream_stalled`, ...), an
outbound call whose answer is unusable (`no_common_codec`, ...), and a media stream whose
`start` was refused, as `start_refused:<code>` -- that one keeps its code in the string
because dashboards and webhook consumers already read it there.
"""

from __future__ import annotations

from enum import Enum
from typing import NewType, TypeAlias


class WireEnum(str, Enum):
    """A `str` enum that is its value everywhere: in `str()`, f-strings, `%s` logging, JSON,
    metric labels and as a dict key (Python 3.10 has no `enum.StrEnum`)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    def __hash__(self) -> int:  # as the value's: a dict keyed by one finds the other
        return hash(str(self.value))


class EndReason(WireEnum):
    """A fixed end reason; the value is the wire string."""

    # Someone hung up.
    HANGUP = "hangup"  # DELETE of the call, the API's hang-up, or no reason given
    REMOTE_HANGUP = "remote_hangup"  # the far end's BYE
    STOP = "stop"  # a media stream's `stop` message
    SOCKET_CLOSED = "socket_closed"  # a media stream's websocket closed without `stop`
    TRANSPORT_CLOSED = "transport_closed"  # a phone leg could not send any more
    CANCELLED = "cancelled"  # an inbound SIP call's CANCEL before the answer
    TRANSFERRED = "transferred"  # a SIP REFER whose transfer succeeded
    # The media path.
    CONNECTION_FAILED = "connection_failed"  # WebRTC: never connected, or failed for good
    CONNECTION_CLOSED = "connection_closed"  # WebRTC: the peer connection closed
    CONNECTION_LOST = "connection_lost"  # WebRTC: the path went and did not come back in time
    CONNECT_TIMEOUT = "connect_timeout"  # no media path within the connect timeout
    IDLE_TIMEOUT = "idle_timeout"  # the caller's media stopped for the idle timeout
    MEDIA_TIMEOUT = "media_timeout"  # SIP: the far end's RTP absent (--sip-media-timeout)
    MAX_CALL_SECONDS = "max_call_seconds"  # the call's time limit
    # The server.
    SERVER_DRAINING = "server_draining"  # SIGTERM's drain deadline
    SHUTDOWN = "shutdown"  # the server stopped (a second SIGTERM, or the end of a drain)
    SETUP_FAILED = "setup_failed"  # the leg could not be set up
    PLUGIN_ENDED = "plugin_ended"  # the plugin ended the session without an error
    INTERNAL_ERROR = "internal_error"  # an outbound call failed inside the agent
    # SIP call set-up.
    REJECTED = "rejected"  # inbound: refused; outbound: a final failure not listed below
    BUSY = "busy"  # outbound: 486 or 600
    NO_ANSWER = "no_answer"  # outbound: 480, or nobody answered within the ring time
    NOT_FOUND = "not_found"  # outbound: 404 or 604
    TIMEOUT = "timeout"  # outbound: 408, or no final answer to the INVITE
    AUTH_FAILED = "auth_failed"  # outbound: 401/407 again after the credentials were sent
    UNREACHABLE = "unreachable"  # outbound: the trunk could not be reached
    NO_ACK = "no_ack"  # inbound: no ACK for the 2xx; outbound: none for a re-INVITE's 2xx
    BAD_ANSWER = "bad_answer"  # the SDP in an ACK or a re-INVITE answer was unusable
    NO_SDP_ANSWER = "no_sdp_answer"  # outbound: a 2xx without an SDP answer
    ENDED = "ended"  # outbound: BYE text for a 2xx it cannot use (ended, or another fork)
    # Metrics only: a leg removed without having been closed.
    UNKNOWN = "unknown"


CodedEnding = NewType("CodedEnding", str)
"""An end reason that names a coded error (module docstring): built by `coded` or
`start_refused`, never from a literal."""

Ending: TypeAlias = "EndReason | CodedEnding"
"""What a call may end with: a fixed reason, or a coded error's code."""

START_REFUSED = "start_refused"


def coded(code: str) -> CodedEnding:
    """The ending for a coded error (an `AgentError`'s or an SDP problem's `code`)."""
    return CodedEnding(code)


def start_refused(code: str) -> CodedEnding:
    """A media stream's ending when its `start` was refused with `code`."""
    return CodedEnding(f"{START_REFUSED}:{code}")
