"""What every telephony transport shares: narrowband PCM in, paced 20 ms chunks out.

Follow one frame: the transport's payload → codec decode (int16 at 8/16 kHz) →
`FrameAssembler.push_pcm16` → the plugin slot → the ticker's batched step → `Leg.on_output`
→ `PlayoutBuffer` → every 20 ms on the `Pacer`: pop 20 ms (silence on underrun)
→ `ChunkResampler` → codec encode → the wire: `send_chunk` from the leg's own send loop (a
websocket message), or an RTP packet on the process's shared send clock (rtp_leg.py).

A telephony leg registers with the agent's `LegRegistry` when built (the caller holds
`agent.admit()` around setup), so it counts against the same limit as WebRTC calls, shows in
health and closes on shutdown.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from agent.audio.clock import MonotonicClock
from agent.audio.pacer import Pacer
from agent.audio.pcm import PTIME
from agent.call_settings import CallSettings
from agent.end_reason import Ending, EndReason
from agent.leg import Leg, playout_stats
from agent.realtime.events import server_event
from agent.realtime.rate_limit import TokenBucket
from agent.telephony.codec import NarrowbandCodec
from agent.telephony.resample import ChunkResampler
from agent.worker_tag import ID_TOKEN_BYTES, tagged_token

if TYPE_CHECKING:
    from agent.media_agent import MediaAgent

log = logging.getLogger(__name__)

DTMF_DIGITS = frozenset("0123456789*#ABCD")
# What a transport's send raises when the far end or the socket is gone: the leg ends.
SEND_ERRORS = (ConnectionError, OSError, RuntimeError)
# A keypad sends a few digits a second; each digit is work on the model's shared worker.
DTMF_RATE = 10.0
DTMF_BURST = 20


class TelephonyLeg(Leg):
    id_prefix: ClassVar[str] = "telephony"  # the leg id's prefix, and the stats' `kind`

    def __init__(self, agent: MediaAgent, codec: NarrowbandCodec,
                 settings: CallSettings | None = None, leg_id: str | None = None) -> None:
        # leg_id: an id handed out before the leg existed (a SIP call's), else a fresh one.
        super().__init__(leg_id or f"{self.id_prefix}_{tagged_token(ID_TOKEN_BYTES)}",
                         agent.plugin,
                         agent.ticker, settings or agent.settings.call, agent.legs.discard)
        self.codec = codec.for_leg()  # its own encoder/decoder state where it has one (G.722)
        self.dtmf_budget = TokenBucket(DTMF_RATE, DTMF_BURST)
        self.dtmf_refused = 0
        rate = self.capabilities.sample_rate
        self.chunk_samples = int(rate * PTIME)
        self.resampler = ChunkResampler(rate, codec.sample_rate)
        self.pacer: Pacer = Pacer(MonotonicClock(), PTIME)  # always paced (Leg: Pacer | None)
        self.playout.follow(self.pacer, rate)
        self.chunks_in = 0
        self.chunks_out = 0
        self.bytes_out = 0  # encoded payload bytes (the metrics' outbound bytes)
        self.agent_chunks_out = 0  # chunks that carried agent audio (not underrun silence)
        agent.legs.add(self)

    def start_sending(self) -> None:
        self.tasks.spawn(self._send_loop(), "send")

    async def close_transport(self, reason: Ending) -> None:
        try:
            await self.close_socket(reason)
        finally:
            self.resampler.close()

    async def close_socket(self, reason: Ending) -> None:
        """Release the socket; subclasses override."""

    # -- media ------------------------------------------------------------------------------

    def push_inbound(self, pcm: np.ndarray) -> None:
        """int16 mono samples at the codec's rate from the caller."""
        self.watchdog.media_started()
        self.watchdog.heard()
        self.chunks_in += 1
        if self.slot is None or len(pcm) == 0:
            return
        self.push_caller_audio(self.assembler.push_pcm16(pcm, self.codec.sample_rate))

    @property
    def consumed_samples(self) -> int:
        """Agent samples that have left the playout buffer (sent, or dropped)."""
        return self.queued_samples - self.playout.buffered_samples

    def next_payload(self) -> bytes:
        """The next 20 ms of agent audio, encoded (silence on underrun, never blocks)."""
        audio = self.playout.pop(self.chunk_samples)
        self.chunks_out += 1
        if audio is not None:
            self.agent_chunks_out += 1
        payload = self.codec.encode(self.resampler.convert(audio))
        self.bytes_out += len(payload)
        return payload

    async def _send_loop(self) -> None:
        while True:
            await self.pacer.wait_next()
            try:
                await self.send_chunk(self.next_payload())
            except SEND_ERRORS as exc:
                self.end_on_send_error(exc)
                return

    def end_on_send_error(self, exc: BaseException) -> None:
        log.info("%s: send failed (%r); ending", self.id, exc)
        self.tasks.spawn(self.close(EndReason.TRANSPORT_CLOSED), "close")

    async def send_chunk(self, payload: bytes) -> None:
        """One encoded chunk to the far end; a leg that uses `start_sending`'s loop overrides."""
        raise NotImplementedError

    # -- caller events ----------------------------------------------------------------------

    def admit_dtmf(self) -> bool:
        """Whether one more keypad digit fits the rate limit (a refusal is counted)."""
        if self.dtmf_budget.take():
            return True
        self.dtmf_refused += 1
        return False

    async def dtmf(self, digit: str) -> None:
        """A keypad digit from the caller: a session event, and the plugin's hook."""
        self.emit(
            server_event("input_audio_buffer.dtmf_event_received", event=digit,
                         received_at=int(time.time()))
        )
        log.info("%s dtmf %s", self.id, digit)
        if self.slot is not None:
            await self.ticker.send_dtmf(self.slot, digit)

    # -- reporting --------------------------------------------------------------------------

    def outbound_counts(self) -> tuple[int, int]:
        return self.chunks_out, self.bytes_out

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "kind": self.id_prefix,
            "codec": self.codec.name,
            "chunks_in": self.chunks_in,
            "chunks_out": self.chunks_out,
            "agent_chunks_out": self.agent_chunks_out,
            "playout": {**playout_stats(self, self.pacer.reanchors),
                        "short_chunks": self.resampler.short_chunks},
            "dtmf_refused": self.dtmf_refused,
            "events": [event["type"] for event in self.events],
        }
