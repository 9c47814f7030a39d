"""The agent's outgoing audio track: paced 20 ms frames from the playout buffer.

aiortc's sender calls `recv()` back to back and ignores pts for timing, so the track paces
itself (see pacer.py). It never blocks waiting for audio: on underrun it sends silence so RTP
timestamps stay continuous.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from agent.audio.clock import Clock, MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME, float_to_s16
from agent.audio.playout import PlayoutBuffer
from agent.webrtc.encoding import OPUS_COMPLEXITY, InlineAudioEncoder


class AgentAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(
        self,
        playout: PlayoutBuffer,
        sample_rate: int,
        clock: Clock | None = None,
        on_chunk: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__()
        self.playout = playout
        self.sample_rate = sample_rate
        self.samples_per_chunk = int(sample_rate * PTIME)
        self.pacer = Pacer(clock or MonotonicClock(), PTIME)
        playout.follow(self.pacer, sample_rate)
        self._silence = np.zeros(self.samples_per_chunk, dtype=np.int16)
        self._time_base = Fraction(1, sample_rate)
        self._samples_sent = 0
        self._encoder: InlineAudioEncoder | None = None
        # Called once per chunk with True when it carried agent audio, False on underrun.
        self.on_chunk = on_chunk
        self.chunks_sent = 0
        self.bytes_sent = 0  # encoded payload bytes, known only with the inline encoder

    @property
    def encodes_inline(self) -> bool:
        return self._encoder is not None

    def use_inline_encoder(self, mime_type: str, opus_complexity: int = OPUS_COMPLEXITY) -> None:
        """Return encoded packets instead of raw frames (set once the codec is negotiated)."""
        self._encoder = InlineAudioEncoder(mime_type, self.sample_rate, opus_complexity)

    def next_chunk(self) -> np.ndarray:
        audio = self.playout.pop(self.samples_per_chunk)
        if self.on_chunk is not None:
            self.on_chunk(audio is not None)
        self.chunks_sent += 1
        return self._silence if audio is None else float_to_s16(audio)

    async def recv(self) -> av.AudioFrame | av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        await self.pacer.wait_next()
        samples = self.next_chunk()
        if self._encoder is not None:
            packet = self._encoder.encode(samples)
            self.bytes_sent += packet.size
            return packet
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = self.sample_rate
        frame.pts = self._samples_sent
        frame.time_base = self._time_base
        self._samples_sent += self.samples_per_chunk
        return frame
