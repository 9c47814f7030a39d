"""The media agent: owns the plugin, its ticker and the registry of every live leg."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, cast

import aiortc
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection

from agent.audio.send_clock import SendClock
from agent.call_settings import CallSettings
from agent.end_reason import EndReason
from agent.errors import CallError
from agent.leg import Leg, media_counts, prepare_config
from agent.leg_registry import LegRegistry
from agent.metrics import AgentMetrics
from agent.plugins.base import Plugin, PluginError, SessionConfig
from agent.rtc_tuning import AUDIO_CODECS, accept_rsa_dtls_peers, missing_internals
from agent.rtc_tuning.advertise import advertise_in_sdp
from agent.rtc_tuning.port_range import PortRange, RtcPortsExhausted
from agent.rtc_tuning.sctp_limit import limit_data_channel_messages
from agent.ticker import Ticker
from agent.webrtc.encoding import OPUS_COMPLEXITY
from agent.webrtc.leg import WebRtcLeg, new_call_id
from agent.webrtc.sdp import check_offer_sdp
from agent.webrtc.settings import WebRtcSettings

# Whoever counted a new leg as on its way (a server of several workers) is told here once it
# holds a slot, and stops counting it then: it is counted as held from then on.
ON_PLACED: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "on_placed", default=None)

log = logging.getLogger(__name__)


class SharedCapacity(Protocol):
    """The whole server's call limit, where several worker processes share it (each holds
    its own legs; signaling/workers/limits.py counts them together)."""

    def claim(self, held_here: int) -> bool:
        """This process would hold `held_here` slots: True (and counted) when the server as
        a whole stays within its limit."""

    def publish(self, held_here: int) -> None:
        """This process holds `held_here` slots now."""

    def full(self) -> bool:
        """The server as a whole holds its limit."""


@dataclass
class AgentSettings:
    """The agent's settings: agent-wide ones (`max_calls`, `call`) beside the WebRTC
    transport's, which it takes as `webrtc`."""

    ice_servers: list[RTCIceServer] = field(default_factory=list)
    jitter_prefetch_packets: int = 1
    codecs: tuple[str, ...] = AUDIO_CODECS  # every codec aiortc negotiates, Opus first
    max_calls: int = 0  # 0 = no limit beyond the plugin's own
    inline_encoding: bool = True
    opus_complexity: int = OPUS_COMPLEXITY  # --opus-complexity: encoder CPU against quality
    inline_decoding: bool = True
    call: CallSettings = field(default_factory=CallSettings)
    # --rtc-ports (applied process-wide by rtc_tuning.port_range; kept here to be shown)
    rtc_ports: PortRange | None = None
    rtc_advertise: tuple[str, ...] = ()  # --rtc-advertise
    # --rtc-udp-port (the mux is process-wide, rtc_tuning.udp_mux; kept here to be shown)
    rtc_udp_port: int | None = None
    reconnect_seconds: float = 10.0  # --reconnect-seconds

    @property
    def webrtc(self) -> WebRtcSettings:
        """What the WebRTC transport takes, read from the fields above when a call is set up."""
        return WebRtcSettings(
            ice_servers=tuple(self.ice_servers),
            advertise=tuple(self.rtc_advertise),
            jitter_prefetch_packets=self.jitter_prefetch_packets,
            codecs=tuple(self.codecs),
            inline_encoding=self.inline_encoding,
            opus_complexity=self.opus_complexity,
            inline_decoding=self.inline_decoding,
            reconnect_seconds=self.reconnect_seconds,
        )


class MediaAgent:
    def __init__(self, plugin: Plugin, settings: AgentSettings | None = None) -> None:
        self.plugin = plugin
        self.settings = settings or AgentSettings()
        accept_rsa_dtls_peers()
        limit_data_channel_messages()
        self.ticker = Ticker(plugin)
        self.send_clock = SendClock()  # the 20 ms sends of every RTP leg
        self.metrics = AgentMetrics(plugin.id)
        self.legs = LegRegistry(on_added=self._leg_started, on_removed=self._leg_ended)
        self._started = False
        self.metrics.attach(self)
        self.ticker.on_tick = self.metrics.observe_tick
        # Set by a graceful drain: no new calls, live ones go on (see signaling/drain.py).
        self.draining = False
        # Set where other processes share the server's call limit.
        self.shared_capacity: SharedCapacity | None = None

    def stop_timing_metrics(self) -> None:
        """No per-tick histogram work (`--no-metrics`): nobody scrapes it."""
        self.ticker.on_tick = None

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
        limits = [n for n in (self.settings.max_calls, self.plugin.capabilities().max_sessions)
                  if n]
        return min(limits) if limits else 0

    @property
    def has_room(self) -> bool:
        """A new call would be admitted now (not draining, a slot free)."""
        return not self.draining and not self._full()

    def _full(self) -> bool:
        """Every slot of this process, or of the server as a whole, is taken."""
        capacity = self.capacity
        return bool(capacity and self.legs.held_slots >= capacity) or (
            self.shared_capacity is not None and self.shared_capacity.full())

    def check_capacity(self) -> None:
        if self.draining:
            self.metrics.refused("draining")
            raise CallError("draining", "the server is draining for a restart; call another "
                            "instance or retry later", status=503)
        if self._full():
            self._refuse_full(self.capacity)

    def _refuse_full(self, capacity: int) -> NoReturn:
        self.metrics.refused("server_full")
        raise CallError(
            "server_full", f"all {capacity} call slots are in use; retry later", status=503
        )

    @property
    def webrtc_legs(self) -> dict[str, WebRtcLeg]:
        """The live WebRTC legs (a view of `legs`)."""
        return cast("dict[str, WebRtcLeg]", self.legs.of_transport("webrtc"))

    @property
    def telephony_legs(self) -> dict[str, Leg]:
        """The live telephony legs (a view of `legs`)."""
        return {leg.id: leg for leg in self.legs if leg.transport != "webrtc"}

    async def create_call(
        self, offer_sdp: object, session: SessionConfig | None = None
    ) -> tuple[WebRtcLeg, str]:
        """Answer an SDP offer. Returns the leg and the answer SDP; raises AgentError."""
        sdp = check_offer_sdp(offer_sdp)
        with self.admit():
            return await self._create_call(sdp, session or SessionConfig())

    async def _create_call(self, sdp: str, session: SessionConfig) -> tuple[WebRtcLeg, str]:
        # The plugin sees the config first: a refused voice costs no peer connection.
        prepared = await prepare_config(self.plugin, session)
        webrtc = self.settings.webrtc
        pc = RTCPeerConnection(RTCConfiguration(iceServers=list(webrtc.ice_servers)))
        call = WebRtcLeg(new_call_id(), pc, self.plugin, self.ticker, self.settings.call,
                         self.legs.discard)
        try:
            try:
                await call.accept_offer(sdp, webrtc)
            except BaseException:
                self.plugin.discard_runtime_config(prepared.runtime_config)
                raise
            await call.open_plugin_slot(prepared)
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)  # gathers: binds the host candidates' ports
        except BaseException as exc:
            if isinstance(exc, RtcPortsExhausted):
                self.metrics.refused(exc.code)
            await call.close(EndReason.SETUP_FAILED)
            raise
        self.legs.add(call)
        call.start_watchdog()
        return call, advertise_in_sdp(pc.localDescription.sdp, webrtc.advertise)

    def _leg_started(self, leg: Leg) -> None:
        self.metrics.call_started(leg.transport)
        log.info("call %s start plugin=%s transport=%s calls=%d", leg.id, self.plugin.id,
                 leg.transport, len(self.legs))

    def _leg_ended(self, leg: Leg) -> None:
        if self.shared_capacity is not None:
            self.shared_capacity.publish(self.legs.held_slots)
        self.metrics.call_ended(leg.transport, leg.end_reason, media_counts(leg))
        log.info("call %s end reason=%s duration=%.1fs calls=%d", leg.id, leg.end_reason,
                 leg.stats()["age_s"], len(self.legs))

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold a slot while a leg is set up (raises CallError when full or draining)."""
        self.check_capacity()
        shared = self.shared_capacity
        if shared is not None and not shared.claim(self.legs.held_slots + 1):
            self._refuse_full(self.capacity)  # another process took the last slot meanwhile
        try:
            with self.legs.reserve():
                on_placed = ON_PLACED.get()
                if on_placed is not None:
                    on_placed()
                yield
        finally:
            if shared is not None:
                shared.publish(self.legs.held_slots)

    async def hangup(self, call_id: str) -> bool:
        leg = self.legs.get(call_id)
        if leg is None:
            return False
        await leg.close(EndReason.HANGUP)
        return True

    def health(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin.id,
            "active_calls": len(self.legs),
            "legs": self.legs.count_by_transport(),
            "capacity": self.capacity,
            "ticker": self.ticker.counters.to_dict(),
            "plugin_slots": len(self.ticker.slots),
            "plugin_health": self.plugin.health(),
            # Flat between calls on a healthy server: a leak shows here first.
            "event_loop_tasks": len(asyncio.all_tasks()),
        }

    async def close(self) -> None:
        await asyncio.gather(*(leg.close(EndReason.SHUTDOWN) for leg in self.legs),
                             return_exceptions=True)
        self.send_clock.close()
        await self.ticker.close()
        await self.plugin.close()


__all__ = ["MediaAgent", "AgentSettings", "CallError", "PluginError"]
