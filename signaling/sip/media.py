"""A SIP call's media: the existing plain RTP leg, told where to send by SDP.

`SipRtpLeg` is `agent.telephony.rtp_leg.RtpLeg` with its own transport name ("sip", so
`/health`, `/metrics` and `/metrics/calls` tell SIP calls from HTTP-created RTP legs), the
SDP's direction applied (on hold the agent stops sending; while the caller sends nothing by
agreement, silence is not idleness) and the remote address movable by a re-INVITE. When the
leg ends for any reason (media timeout, `DELETE /v1/realtime/calls/{id}`, drain, shutdown) it
tells the user agent, which sends the BYE. The remote is the SDP's c=/m= address, checked
against `--rtp-allow` like an HTTP-created leg's; RTP is taken from that IP on the first port
it sends from.

Anyone can write an SDP address, so the leg sends only a short burst there until the far
end's RTP is heard, or until the user agent vouches for the address (`vouch`: the host the
call's ACK came from, or the one the agent itself dialed); see
agent/telephony/remote_check.py. `--sip-media-timeout` ends a call whose far end is not
heard within that many seconds, or falls silent that long mid-call (`media_timeout`,
instead of the idle timeout of other legs); a call held by agreement (the far end sends
nothing) is not silent, once its remote was confirmed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from agent.end_reason import Ending, EndReason
from agent.leg import LegCapabilities, prepare_config
from agent.media_agent import MediaAgent
from agent.plugins.base import SessionConfig
from agent.telephony.remote_check import RemoteCheck
from agent.telephony.rtp_leg import (
    Address,
    RtpLeg,
    RtpProtocol,
    RtpSettings,
    bind_rtp_port,
    check_remote,
)
from agent.telephony.srtp import SrtpKeys, SrtpTransform
from signaling.auth import Principal
from signaling.sip.flag_types import seconds_between
from signaling.sip.sdp import AudioChoice

# The owner of every SIP call: the server itself. An open server, or an --admin-key (and a
# key of no tenant), may list and end it through /v1/realtime/calls/{id} like any call.
SIP_OWNER = Principal("sip")

LegClosed = Callable[["SipRtpLeg", Ending], None]

DEFAULT_MEDIA_TIMEOUT = 10.0  # seconds without the far end's RTP before a SIP call ends


class SipRtpLeg(RtpLeg):
    id_prefix = "sip"
    transport = "sip"
    can = LegCapabilities(dtmf=True, refer=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agent_sends = True  # the answer's direction lets the agent send
        self.caller_sends = True  # the offer's direction says the caller sends
        self.on_closed: LegClosed | None = None
        self.sip_call_id: str | None = None
        self.direction = "sendrecv"
        self._protocol: RtpProtocol | None = None
        self.remote_check = RemoteCheck()
        self.watchdog.media_timeout = DEFAULT_MEDIA_TIMEOUT

    def vouch(self, host: str) -> None:
        """The user agent knows `host` for the far end's (see the module doc): when the
        remote is on it, it is confirmed without waiting for its RTP."""
        if self.remote is not None and self.remote[0] == host and self.remote_check is not None:
            self.remote_check.confirm(host)

    def start_watchdog(self) -> None:
        self.watchdog.started_at = time.monotonic()  # an early-media leg waited for its answer
        super().start_watchdog()

    def apply(self, choice: AudioChoice, direction: str) -> None:
        """Direction and remote address from an offer (the initial INVITE or a re-INVITE)."""
        self.direction = direction
        self._payload_type = choice.payload_type  # the offer's own, dynamic ones (L16) too
        self.agent_sends = choice.agent_sends
        self.caller_sends = choice.caller_sends
        if choice.remote is not None and choice.remote != self.remote:
            if self.remote_check is not None:
                self.remote_check.moved(choice.remote[0])
            self.remote = choice.remote
            self.remote_source = None  # learn the new sender's port afresh
            self.latching = False

    def _send_one(self, payload: bytes) -> None:
        # RtpLeg's 20 ms tick: inbound playout, then one packet out. On hold, only the first.
        held = not self.caller_sends and (self.remote_check is None
                                          or self.remote_check.confirmed)
        if held:  # held or muted by agreement: no audio is not idleness
            self.watchdog.media_started()
            self.watchdog.heard()
        if self.agent_sends:
            super()._send_one(payload)
        else:
            self._play_one()

    async def close_socket(self, reason: Ending) -> None:
        try:
            await super().close_socket(reason)
        finally:
            if self._protocol is not None:
                self._protocol.leg = None
            callback, self.on_closed = self.on_closed, None
            if callback is not None:
                callback(self, reason)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "sip_call_id": self.sip_call_id, "direction": self.direction}


def wire_sip_leg(leg: SipRtpLeg, protocol: RtpProtocol, choice: AudioChoice, *,
                 owner: Principal, sip_call_id: str, media_timeout: float) -> None:
    """What a new SIP leg is given, inbound or outbound: its socket's protocol, its owner and
    SIP Call-ID, its media timeout, and the negotiated codec and direction."""
    protocol.leg = leg
    leg._protocol = protocol
    leg.owner = owner
    leg.sip_call_id = sip_call_id
    leg.watchdog.media_timeout = media_timeout
    leg.apply(choice, choice.answer_direction)


async def open_sip_leg(agent: MediaAgent, choice: AudioChoice, settings: RtpSettings,
                       sip_call_id: str, on_closed: LegClosed, *, leg_id: str | None = None,
                       session: SessionConfig | None = None,
                       owner: Principal = SIP_OWNER,
                       srtp: SrtpKeys | None = None,
                       media_timeout: float = DEFAULT_MEDIA_TIMEOUT) -> SipRtpLeg:
    """Admit, bind, open the plugin session (`session`, else the server's default) and
    start sending. Raises CallError (full, draining, no port) or PluginError."""
    remote: Address | None = choice.remote
    if remote is not None:
        check_remote(remote[0], settings)
    with agent.admit():
        transport, protocol, port = await bind_rtp_port(settings)
        leg = SipRtpLeg(agent, choice.codec, transport, (settings.local_host, port), remote,
                        settings, dtmf_payload_type=choice.dtmf_payload_type, leg_id=leg_id)
    if srtp is not None:
        leg.srtp = SrtpTransform(srtp)  # SDES-SRTP (sdes.py): before any packet moves
    wire_sip_leg(leg, protocol, choice, owner=owner, sip_call_id=sip_call_id,
                 media_timeout=media_timeout)
    try:
        await leg.open_plugin_slot(await prepare_config(leg.plugin, session or SessionConfig()))
    except BaseException:
        await leg.close(EndReason.SETUP_FAILED)
        raise
    leg.on_closed = on_closed  # from here on, the call's end is the user agent's to signal
    leg.start_watchdog()
    leg.start_sending()
    return leg


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--sip-media-timeout", type=seconds_between(0.1, 3600),
                       default=DEFAULT_MEDIA_TIMEOUT, metavar="S",
                       help="end a SIP call (reason media_timeout) when the far end's RTP is "
                       "not heard within S seconds of the answer, or stops for S seconds "
                       "mid-call; replaces --idle-timeout for SIP calls (default "
                       f"{DEFAULT_MEDIA_TIMEOUT:g})")
