"""The WebRTC transport: a peer connection feeding a leg, and a paced track taking its audio.

Follow one frame: the remote track's decoded audio → `Leg.assembler` (resample to the
plugin's rate) → the plugin slot → the ticker's batched step → `Leg.on_output` →
`PlayoutBuffer` → `AgentAudioTrack.recv` (paced 20 ms) → the peer. Session events travel
on the `oai-events` data channel (agent/realtime/protocol.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

import av
import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection, RTCRtpSender, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent import rtc_tuning
from agent.call_settings import CallSettings
from agent.end_reason import Ending, EndReason
from agent.errors import CallError
from agent.leg import Leg, LegCapabilities, playout_stats
from agent.plugins.base import Plugin, StepOutput
from agent.realtime.events import error_event
from agent.realtime.protocol import RealtimeProtocol
from agent.rtc_tuning import InlineAudioDecoding
from agent.rtc_tuning.sctp_limit import OVERSIZED_EVENT
from agent.ticker import Ticker
from agent.webrtc.encoding import supports_inline
from agent.webrtc.ice_control import CallIce
from agent.webrtc.outbound import AgentAudioTrack
from agent.webrtc.sdp import with_explicit_directions
from agent.webrtc.settings import WebRtcSettings
from agent.worker_tag import ID_TOKEN_BYTES, tagged_token

log = logging.getLogger(__name__)

PC_CLOSE_TIMEOUT = 5.0


def new_call_id() -> str:
    return "call_" + tagged_token(ID_TOKEN_BYTES)


class WebRtcLeg(Leg):
    transport = "webrtc"
    can = LegCapabilities(realtime_session=True, ice_restart=True)

    def __init__(self, call_id: str, pc: RTCPeerConnection, plugin: Plugin, ticker: Ticker,
                 settings: CallSettings, on_closed: Callable[[Leg], None]) -> None:
        super().__init__(call_id, plugin, ticker, settings, on_closed)
        self.pc = pc
        self.track = AgentAudioTrack(self.playout, self.capabilities.sample_rate)
        self.pacer = self.track.pacer
        self.realtime = RealtimeProtocol(self)
        self.sidebands.speak_with(self.realtime)
        self.inbound_decoding: InlineAudioDecoding | None = None  # None: aiortc decodes
        self.codec: str | None = None
        self.sender: RTCRtpSender | None = None  # set once the offer is accepted
        self.ice = CallIce(pc, call_id)  # restarts, trickle, the reconnect grace
        pc.on("track", self.on_remote_track)
        pc.on("datachannel", self.attach_channel)
        pc.on("connectionstatechange", self.on_connection_state)

    @property
    def connected_at(self) -> float | None:
        return self.watchdog.media_started_at

    # -- the peer connection ----------------------------------------------------------------

    def on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            if self.watchdog.media_started_at is None and self.ice.restartable is not None:
                self.tasks.spawn(self.ice.supervise(lambda: self.connected_at,
                                                    lambda: self.close(EndReason.CONNECTION_LOST)),
                                 "reconnect")
            self.watchdog.media_started()
        elif state == "failed" and self.ice.restartable is not None and (
                self.connected_at is not None):
            pass  # the path is gone: CallIce.supervise gives the caller its grace
        elif state == "failed":
            self.tasks.spawn(self.close(EndReason.CONNECTION_FAILED), "close")
        elif state == "closed":
            self.tasks.spawn(self.close(EndReason.CONNECTION_CLOSED), "close")

    @property
    def ice_generation(self) -> int:
        """How many ICE restarts this call has begun (part of its ETag)."""
        return self.ice.generation

    def attach_channel(self, channel: RTCDataChannel) -> None:
        channel.on("message", self.realtime.inbox.offer)
        channel.on(OVERSIZED_EVENT, self.realtime.refuse_oversized)
        channel.on("close", self.realtime.detach)
        self.realtime.attach(channel.send)

    async def close_transport(self, reason: Ending) -> None:
        self.track.stop()
        try:
            # pc.close() can hang on a dead transport; never let it pin the leg.
            await asyncio.wait_for(self.pc.close(), timeout=PC_CLOSE_TIMEOUT)
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("call %s: peer connection close: %r", self.id, exc)
        await self.ice.close()  # after pc.close(): DTLS's close_notify still goes out
        self.realtime.detach()

    async def accept_offer(self, sdp: str, settings: WebRtcSettings) -> None:
        """Apply the caller's offer: audio only, our codecs, the tuned receive path, our
        track on the first audio m-line (CallError with a code when the offer is unusable)."""
        pc = self.pc
        try:
            await pc.setRemoteDescription(
                RTCSessionDescription(sdp=with_explicit_directions(sdp), type="offer"))
        except Exception as exc:
            if rtc_tuning.is_no_common_codec(exc):
                raise CallError(
                    "no_common_codec", "none of the offered audio codecs is supported"
                ) from None
            raise CallError("invalid_sdp", f"the offer could not be used: {exc}") from None
        audio = [t for t in pc.getTransceivers() if t.kind == "audio"]
        for transceiver in pc.getTransceivers():
            if transceiver.kind != "audio":
                transceiver.direction = "inactive"  # no video: don't receive or decode it
        if not audio:
            raise CallError("no_audio", "the offer has no usable audio m-line")
        main = audio[0]
        remaining = rtc_tuning.restrict_codecs(main, list(settings.codecs))
        if not remaining:
            raise CallError(
                "no_common_codec",
                "none of the offered codecs is accepted "
                f"(agent accepts {', '.join(settings.codecs)})",
            )
        for extra in audio[1:]:
            extra.direction = "inactive"
        rtc_tuning.set_audio_jitter_prefetch(main.receiver, settings.jitter_prefetch_packets)
        if settings.inline_decoding:
            self.inbound_decoding = rtc_tuning.decode_audio_inline(main.receiver,
                                                                   self.capabilities.channels)
        main.direction = "sendrecv"
        main.sender.replaceTrack(self.track)
        codec = rtc_tuning.negotiated_codecs(main)[0]
        if settings.inline_encoding and supports_inline(codec.mimeType):
            self.track.use_inline_encoder(codec.mimeType, settings.opus_complexity)
        self.codec = codec.mimeType.split("/")[-1]
        self.sender = main.sender
        self.ice.setup(settings.advertise, settings.reconnect_seconds)


    # -- media ------------------------------------------------------------------------------

    def on_remote_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self.tasks.spawn(self._read_inbound(track), "inbound")
        else:
            self.tasks.spawn(self._drain(track), "drain")

    async def _read_inbound(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                # (aiortc types recv() Frame | Packet; an audio track's gives AudioFrames)
                frame = cast(av.AudioFrame, await track.recv())
            except MediaStreamError:
                return
            self.watchdog.heard()
            if self.slot is not None:
                self.push_caller_audio(self.assembler.push(frame))

    async def _drain(self, track: MediaStreamTrack) -> None:
        # An unread track fills an unbounded queue inside aiortc.
        while True:
            try:
                await track.recv()
            except MediaStreamError:
                return

    # -- events -----------------------------------------------------------------------------

    def after_output(self, output: StepOutput, audio: np.ndarray) -> None:
        self.realtime.on_output(output, audio)

    def deliver(self, event: dict[str, Any]) -> None:
        self.realtime.channel.send(event)

    def notify_ending(self, reason: Ending, message: str) -> bool:
        self.realtime.notify_ending(reason, message)
        return True

    async def on_time_limit(self, limit: float) -> None:
        # OpenAI's own clients recognise this error code as the session's hard end.
        self.emit(error_event("session_expired",
                              f"the call hit its maximum duration of {limit:g} s"))
        await self.end_with_notice(EndReason.MAX_CALL_SECONDS, f"calls are limited to {limit:g} s")

    def describe_session(self) -> dict[str, Any]:
        return self.realtime.describe_session()

    # -- reporting --------------------------------------------------------------------------

    def outbound_counts(self) -> tuple[int, int]:
        if self.track.encodes_inline or self.sender is None:
            return self.track.chunks_sent, self.track.bytes_sent
        # aiortc encodes on its own thread: only its sender knows the payload sizes.
        return self.track.chunks_sent, rtc_tuning.sent_payload_bytes(self.sender) or 0

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "connection_state": self.pc.connectionState,
            "ice_restarts": self.ice.restarts_completed,
            "reconnects": self.ice.reconnects,
            "decode_errors": (self.inbound_decoding.decode_errors
                              if self.inbound_decoding is not None else None),
            "playout": playout_stats(self, self.track.pacer.reanchors),
            "plugin_session": self.slot.plugin_session.stats() if self.slot else None,
        }
