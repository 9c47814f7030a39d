"""The media agent: owns the plugin, its ticker and every live call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiortc
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from .call import Call, new_call_id
from .call_settings import CallSettings
from .errors import CallError
from .plugins.base import Plugin, PluginError, SessionConfig
from .recording import take_record_option
from .rtc_tuning import (
    AUDIO_CODECS,
    accept_rsa_dtls_peers,
    decode_audio_inline,
    is_no_common_codec,
    missing_internals,
    negotiated_codecs,
    restrict_codecs,
    set_audio_jitter_prefetch,
)
from .encoding import supports_inline
from .sdp import check_offer_sdp, with_explicit_directions
from .metrics import AgentMetrics, media_counts, transport_of
from .ticker import Ticker

log = logging.getLogger(__name__)

DEFAULT_CODECS = AUDIO_CODECS  # every codec aiortc negotiates, Opus first


@dataclass
class AgentSettings:
    ice_servers: list[RTCIceServer] = field(default_factory=list)
    jitter_prefetch_packets: int = 1
    codecs: tuple[str, ...] = DEFAULT_CODECS
    max_calls: int = 0  # 0 = no limit beyond the plugin's own
    inline_encoding: bool = True
    inline_decoding: bool = True
    call: CallSettings = field(default_factory=CallSettings)


class ManagedSession(Protocol):
    """A non-WebRTC leg (telephony websocket, plain RTP) that holds a call slot."""

    id: str

    async def close(self, reason: str = "hangup") -> None: ...

    def stats(self) -> dict[str, Any]: ...


class MediaAgent:
    def __init__(self, plugin: Plugin, settings: AgentSettings | None = None) -> None:
        self.plugin = plugin
        self.settings = settings or AgentSettings()
        accept_rsa_dtls_peers()
        self.ticker = Ticker(plugin)
        self.calls: dict[str, Call] = {}
        # Other legs on the same ticker; they count against the same admission limit.
        self.sessions: dict[str, ManagedSession] = {}
        self._pending_calls = 0
        self._started = False
        self.metrics = AgentMetrics(plugin.id)
        self.metrics.attach(self)
        self.ticker.on_tick = self.metrics.observe_tick
        # Set by a graceful drain: no new calls, live ones go on (see signaling/drain.py).
        self.draining = False

    async def start(self) -> None:
        if not self._started:
            missing = await missing_internals()
            if missing:
                log.warning("aiortc %s lacks internals this agent tunes; using aiortc's own "
                            "path for: %s", aiortc.__version__, "; ".join(missing))
            await self.plugin.start()
            self._started = True

    @property
    def started(self) -> bool:
        """The plugin is loaded and started."""
        return self._started

    @property
    def capacity(self) -> int:
        limits = [n for n in (self.settings.max_calls, self.plugin.capabilities().max_sessions) if n]
        return min(limits) if limits else 0

    def check_capacity(self) -> None:
        if self.draining:
            self.metrics.refused("draining")
            raise CallError("draining", "the server is draining for a restart; call another "
                            "instance or retry later", status=503)
        capacity = self.capacity
        if capacity and len(self.calls) + len(self.sessions) + self._pending_calls >= capacity:
            self.metrics.refused("server_full")
            raise CallError(
                "server_full", f"all {capacity} call slots are in use; retry later", status=503
            )

    async def create_call(
        self, offer_sdp: object, session: SessionConfig | None = None
    ) -> tuple[Call, str]:
        """Answer an SDP offer. Returns the call and the answer SDP; raises CallError/PluginError."""
        sdp = check_offer_sdp(offer_sdp)
        self.check_capacity()
        self._pending_calls += 1
        try:
            return await self._create_call(sdp, session or SessionConfig())
        finally:
            self._pending_calls -= 1

    async def _create_call(self, sdp: str, session: SessionConfig) -> tuple[Call, str]:
        session, record_allowed = take_record_option(session)
        runtime_config = await self.plugin.prepare_runtime_config(session)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=list(self.settings.ice_servers)))
        call = Call(new_call_id(), pc, self.plugin, self.ticker, self.settings.call, self._forget)
        call.session_config = session
        pc.on("track", call.on_remote_track)
        pc.on("datachannel", call.attach_channel)
        pc.on("connectionstatechange", call.on_connection_state)
        try:
            await self._negotiate(pc, call, sdp)
            call.ticked = await self.ticker.open_session(
                runtime_config, call.on_output, call.on_plugin_error
            )
            call.start_recording(record_allowed)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except BaseException:
            if call.ticked is None:
                self.plugin.discard_runtime_config(runtime_config)
            await call.close("setup_failed")
            raise
        self.calls[call.id] = call
        self.metrics.call_started("webrtc")
        call.start_watchdog()
        log.info("call %s start plugin=%s calls=%d", call.id, self.plugin.id, len(self.calls))
        return call, pc.localDescription.sdp

    async def _negotiate(self, pc: RTCPeerConnection, call: Call, sdp: str) -> None:
        try:
            await pc.setRemoteDescription(
                RTCSessionDescription(sdp=with_explicit_directions(sdp), type="offer"))
        except Exception as exc:
            if is_no_common_codec(exc):
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
        remaining = restrict_codecs(main, list(self.settings.codecs))
        if not remaining:
            raise CallError(
                "no_common_codec",
                f"none of the offered codecs is accepted (agent accepts {', '.join(self.settings.codecs)})",
            )
        for extra in audio[1:]:
            extra.direction = "inactive"
        set_audio_jitter_prefetch(main.receiver, self.settings.jitter_prefetch_packets)
        if self.settings.inline_decoding:
            call.inbound_decoding = decode_audio_inline(main.receiver)
        main.direction = "sendrecv"
        main.sender.replaceTrack(call.track)
        codec = negotiated_codecs(main)[0]
        if self.settings.inline_encoding and supports_inline(codec.mimeType):
            call.track.use_inline_encoder(codec.mimeType)
        call.codec = codec.mimeType.split("/")[-1]

    async def _forget(self, call: Call) -> None:
        if self.calls.pop(call.id, None) is not None:
            self.metrics.call_ended("webrtc", call.end_reason, media_counts(call))
            log.info(
                "call %s end reason=%s duration=%.1fs calls=%d",
                call.id, call.end_reason, call.stats()["age_s"], len(self.calls),
            )

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a call slot while a non-WebRTC session is set up (raises CallError when full)."""
        self.check_capacity()
        self._pending_calls += 1
        try:
            yield
        finally:
            self._pending_calls -= 1

    def register_session(self, session: ManagedSession) -> None:
        self.sessions[session.id] = session
        self.metrics.call_started(transport_of(session))

    def unregister_session(self, session: ManagedSession) -> None:
        if self.sessions.get(session.id) is session:
            del self.sessions[session.id]
            self.metrics.call_ended(transport_of(session), getattr(session, "end_reason", None),
                                    media_counts(session))

    async def hangup(self, call_id: str) -> bool:
        call = self.calls.get(call_id)
        if call is None:
            return False
        await call.close("hangup")
        return True

    def health(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin.id,
            "active_calls": len(self.calls) + len(self.sessions),
            "other_sessions": len(self.sessions),
            "capacity": self.capacity,
            "ticker": self.ticker.counters.to_dict(),
            "ticker_sessions": len(self.ticker.sessions),
            "plugin_health": self.plugin.health(),
            # Flat between calls on a healthy server: a leak shows here first.
            "event_loop_tasks": len(asyncio.all_tasks()),
        }

    async def close(self) -> None:
        await asyncio.gather(*(call.close("shutdown") for call in list(self.calls.values())),
                             *(leg.close("shutdown") for leg in list(self.sessions.values())),
                             return_exceptions=True)
        await self.ticker.close()
        await self.plugin.close()


__all__ = ["MediaAgent", "AgentSettings", "CallError", "PluginError"]
