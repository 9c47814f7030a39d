"""What the WebRTC transport takes from the agent's settings (`AgentSettings.webrtc`).

ICE servers for the peer connection, the addresses its answer advertises, the codecs it
accepts, aiortc's receive jitter buffer, and whether Opus/G.711 are encoded and decoded
inline on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiortc import RTCIceServer

from agent.rtc_tuning import AUDIO_CODECS
from agent.webrtc.encoding import OPUS_COMPLEXITY


@dataclass(frozen=True)
class WebRtcSettings:
    ice_servers: tuple[RTCIceServer, ...] = ()
    advertise: tuple[str, ...] = ()  # --rtc-advertise: host candidates' public addresses
    jitter_prefetch_packets: int = 1  # --jitter-buffer: 0 releases each packet on arrival
    codecs: tuple[str, ...] = AUDIO_CODECS  # every codec aiortc negotiates, Opus first
    inline_encoding: bool = True
    opus_complexity: int = OPUS_COMPLEXITY  # --opus-complexity: encoder CPU against quality
    inline_decoding: bool = True
    # --reconnect-seconds: how long a call whose ICE path is gone waits for it to come back
    # (the caller resuming, or an ICE restart) before it ends with connection_lost
    reconnect_seconds: float = 10.0
