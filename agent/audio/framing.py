"""Inbound audio of any codec rate/layout → float32 mono at the plugin's rate.

`FrameAssembler` takes decoded `av.AudioFrame`s (Opus 48 kHz stereo, G.711 8 kHz mono, ...)
or raw PCM chunks and resamples them with libswresample (through PyAV); raw PCM at a small
ratio to the plugin's rate (a phone's 8 or 16 kHz to 24 kHz) through polyphase.py instead,
several times cheaper per 20 ms. Every caller passes
`frame_size=None`: audio goes on as it comes, and the ticker cuts the exact plugin frames
from its FIFO, so no packet waits here for the next one. A `frame_size` would re-chunk here
instead.
"""

from __future__ import annotations

import av
import numpy as np

from agent.audio.polyphase import PolyphaseResampler, supported

_LAYOUTS = {1: "mono", 2: "stereo"}


class FrameAssembler:
    """`frame_size=None` passes resampled audio through as it comes (no re-chunking delay)."""

    def __init__(self, sample_rate: int, frame_size: int | None, channels: int = 1) -> None:
        self.sample_rate = sample_rate
        self.frame_size = frame_size
        self.channels = channels
        self._resampler: av.AudioResampler | None = None
        self._resampled_channels = channels
        # Source format changes (e.g. a codec switch) need a fresh resampler.
        self._source_key: tuple[str, str, int] | None = None
        self._polyphase: PolyphaseResampler | None = None  # raw PCM at a small ratio
        self._closed = False

    def close(self) -> None:
        """Free libav's resampler (and its threads) now; later pushes yield nothing."""
        self._closed = True
        self._resampler = None
        self._polyphase = None

    def push(self, frame: av.AudioFrame) -> list[np.ndarray]:
        if self._closed:
            return []
        key = (frame.format.name, frame.layout.name, frame.sample_rate)
        if self._resampler is None or key != self._source_key:
            # Stereo to mono is averaged here, not by libswresample, whose -3 dB pan law
            # would make a mono voice carried in stereo (as Opus decodes) 3 dB louder.
            source_channels = len(frame.layout.channels)
            self._resampled_channels = (
                2 if (self.channels == 1 and source_channels == 2) else self.channels
            )
            self._resampler = av.AudioResampler(
                format="flt",
                layout=_LAYOUTS[self._resampled_channels],
                rate=self.sample_rate,
                frame_size=self.frame_size,
            )
        self._source_key = key
        # Timestamps from the network may jump; the resampler must only see a sample stream.
        frame.pts = None
        return [self._to_array(out) for out in self._resampler.resample(frame)]

    def push_pcm16(self, samples: np.ndarray, sample_rate: int) -> list[np.ndarray]:
        """Mono int16 samples from a non-WebRTC source (telephony websocket, RTP)."""
        if self._closed:
            return []
        same_rate = sample_rate == self.sample_rate
        if self.channels == 1 and self.frame_size is None and (
                same_rate or supported(sample_rate, self.sample_rate)):
            out = np.asarray(samples, dtype=np.float32) * (1 / 32768)
            if not same_rate:
                polyphase = self._polyphase
                if polyphase is None or polyphase.source_rate != sample_rate:
                    # A 20 ms chunk sets the layout; other sizes work too (polyphase.py).
                    polyphase = self._polyphase = PolyphaseResampler(
                        sample_rate, self.sample_rate, sample_rate // 50)
                out = polyphase.convert(out)
            return [out] if len(out) else []
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.int16).reshape(1, -1),
            format="s16",
            layout="mono",
        )
        frame.sample_rate = sample_rate
        return self.push(frame)

    def _to_array(self, frame: av.AudioFrame) -> np.ndarray:
        # Packed float: to_ndarray() is (1, samples * channels), interleaved.
        data = frame.to_ndarray().reshape(-1)
        if self._resampled_channels != self.channels:
            return data.reshape(-1, 2).mean(axis=1, dtype=np.float32)
        if self.channels == 1:
            return data.astype(np.float32, copy=True)
        return data.reshape(-1, self.channels).astype(np.float32, copy=True)
