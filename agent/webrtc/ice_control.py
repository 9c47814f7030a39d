"""A WebRTC call's ICE as its call resource and its network change it: ICE restarts (a
`PATCH` sdpfrag with new credentials, RFC 9725 section 4.4, or a re-offer on the same call),
trickled candidates of the newest ICE generation, and the reconnect grace
(`--reconnect-seconds`) that decides when a call whose path is gone has really ended.

The restart itself (a new aioice connection under the live DTLS session) is
`agent/rtc_tuning/ice_restart.py`; this module speaks SDP and keeps the leg's view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiortc import RTCIceCandidate, RTCPeerConnection

from agent.errors import CallError
from agent.rtc_tuning.advertise import advertise_in_sdp
from agent.rtc_tuning.ice_restart import (
    IceCredentials,
    LocalIce,
    RestartableIce,
    answer_with_ice,
    read_offered_ice,
    restart_sdpfrag,
)
from agent.webrtc.trickle import (
    SdpFragment,
    TrickleError,
    apply_sdpfrag,
    known_mids,
    remote_ice_ufrags,
)

log = logging.getLogger(__name__)

# The ICE path counts as disconnected after this long without a datagram from the caller
# (audio flows every 20 ms); --reconnect-seconds of grace then start.
DISCONNECTED_SECONDS = 3.0
PATH_CHECK_SECONDS = 0.5


class CallIce:
    def __init__(self, pc: RTCPeerConnection, call_id: str) -> None:
        self.pc = pc
        self.call_id = call_id
        self.restartable: RestartableIce | None = None  # None: this call cannot restart ICE
        self.advertise: tuple[str, ...] = ()  # --rtc-advertise
        self.reconnect_seconds = 0.0  # --reconnect-seconds
        self.reconnects = 0  # network outages the call survived
        self._answer: str | None = None  # the latest answer, before --rtc-advertise

    def setup(self, advertise: tuple[str, ...], reconnect_seconds: float) -> None:
        """After the offer created the ICE transport, before ICE starts."""
        self.advertise = advertise
        self.reconnect_seconds = reconnect_seconds
        self.restartable = RestartableIce.install(self.pc)

    @property
    def generation(self) -> int:
        """How many ICE restarts this call has begun (part of its ETag)."""
        return self.restartable.generation if self.restartable is not None else 0

    @property
    def restarts_completed(self) -> int | None:
        return self.restartable.restarts_completed if self.restartable is not None else None

    # -- the reconnect grace ----------------------------------------------------------------

    def path_down(self, now: float, connected_at: float | None) -> bool:
        """ICE failed (consent expired) or nothing arrived for DISCONNECTED_SECONDS."""
        ice = self.restartable
        if ice is None:
            return False
        last = ice.last_received_at or connected_at or now
        return ice.path_down or now - last > DISCONNECTED_SECONDS

    async def supervise(self, connected_at: Callable[[], float | None],
                        lost: Callable[[], Awaitable[None]]) -> None:
        """Call `lost` once the path stays down for --reconnect-seconds (a caller that
        resumes, or restarts ICE, within them keeps the call)."""
        down_since: float | None = None
        while True:
            await asyncio.sleep(PATH_CHECK_SECONDS)
            now = time.monotonic()
            if not self.path_down(now, connected_at()):
                if down_since is not None:
                    self.reconnects += 1
                    log.info("call %s: path back after %.1f s", self.call_id, now - down_since)
                down_since = None
                continue
            if down_since is None:
                down_since = now
                log.info("call %s: path down; %g s to reconnect", self.call_id,
                         self.reconnect_seconds)
            if now - down_since >= self.reconnect_seconds:
                await lost()
                return

    async def close(self) -> None:
        if self.restartable is not None:
            await self.restartable.close()

    # -- from the call resource (PATCH, re-offer) ---------------------------------------------

    def _remote_sdp(self) -> str:
        remote = self.pc.remoteDescription
        if remote is None:
            raise TrickleError("no_remote_description", "the call has no offer yet", status=409)
        return remote.sdp

    def is_restart(self, ufrag: str | None) -> bool:
        """Whether credentials with this ufrag start a new ICE generation."""
        if ufrag is None:
            return False
        current = self.restartable.remote_ufrag if self.restartable is not None else None
        if current is not None:
            return ufrag != current
        return ufrag not in remote_ice_ufrags(self._remote_sdp())

    async def _restart(self, remote: IceCredentials, candidates: list[RTCIceCandidate],
                       ended: bool) -> LocalIce:
        if self.restartable is None:
            raise CallError("ice_restart_unsupported",
                            "this call cannot restart ICE; start a new call", status=422)
        return await self.restartable.restart(remote, candidates, ended)

    def _check_mids(self, fragment: SdpFragment) -> list[str]:
        mids = known_mids(self._remote_sdp())
        for candidate in fragment.candidates:
            if candidate.sdpMid is not None and candidate.sdpMid not in mids:
                raise TrickleError("unknown_mid", f"no media section with mid {candidate.sdpMid!r}")
            if candidate.sdpMid is None and not 0 <= (candidate.sdpMLineIndex or 0) < len(mids):
                raise TrickleError("unknown_mid", "a candidate names no known media section")
        return mids

    async def restart_from_fragment(self, fragment: SdpFragment) -> str:
        """An ICE restart PATCH (RFC 9725 section 4.4): returns the answering sdpfrag."""
        if fragment.ice_ufrag is None or fragment.ice_pwd is None:
            raise TrickleError("invalid_sdpfrag", "an ICE restart needs a=ice-ufrag and a=ice-pwd")
        mids = self._check_mids(fragment)
        local = await self._restart(IceCredentials(fragment.ice_ufrag, fragment.ice_pwd),
                                    fragment.candidates, bool(fragment.ended_mids))
        return advertise_in_sdp(restart_sdpfrag(local, mids[0] if mids else "0"),
                                self.advertise)

    async def trickle(self, fragment: SdpFragment) -> None:
        """Trickled candidates for the call's newest ICE generation."""
        if self.restartable is None or self.restartable.generation == 0:
            await apply_sdpfrag(self.pc, fragment)
            return
        self._check_mids(fragment)
        try:
            for candidate in fragment.candidates:
                await self.restartable.add_remote_candidate(candidate)
            if fragment.ended_mids:
                await self.restartable.add_remote_candidate(None)
        except ValueError:
            raise TrickleError("candidates_ended",
                               "end-of-candidates was already signalled") from None

    async def reoffer(self, sdp: str) -> str:
        """A new offer on the same call: only an ICE restart (new credentials) is taken; the
        rest must be what was negotiated. Returns the answer (the current one when the ICE
        credentials are unchanged)."""
        offered, negotiated = read_offered_ice(sdp), read_offered_ice(self._remote_sdp())
        if offered.credentials is None:
            raise CallError("invalid_sdp", "the offer has no a=ice-ufrag and a=ice-pwd")
        if offered.fingerprints != negotiated.fingerprints:
            raise CallError("dtls_restart_unsupported", "a new DTLS certificate needs a new "
                            "call (the fingerprint changed)", status=422)
        if offered.mids != negotiated.mids:
            raise CallError("renegotiation_unsupported", "a re-offer may only restart ICE: "
                            "its media sections must be the call's", status=422)
        answer = self._answer
        if answer is None:
            local_description = self.pc.localDescription
            if local_description is None:
                raise TrickleError("no_answer", "the call has no answer yet", status=409)
            answer = local_description.sdp
        if self.is_restart(offered.credentials.ufrag):
            local = await self._restart(offered.credentials, offered.candidates, offered.ended)
            answer = self._answer = answer_with_ice(answer, local)
        return advertise_in_sdp(answer, self.advertise)
