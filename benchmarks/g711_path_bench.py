"""Where a G.711 RTP leg's time goes: microseconds per packet pair (one in, one out) by stage.

    python benchmarks/g711_path_bench.py [--packets 3000] [--rounds 5] [--codec PCMU]

Builds a real `RtpLeg` (echo plugin, a loopback UDP socket aimed at a sink) in one process
and drives its 20 ms path by hand, with no event-loop wake-ups in between: each packet
pair is one datagram into `on_datagram` and one `_send_due` of the leg's send-clock phase,
and every fourth pair the 80 ms tick (the slot's frame, the echo plugin's step, the leg's
`on_output`). First the whole path; then each stage alone, on a second leg fed the same
stream (the same objects and calls the path makes, in its order):

- receive: RTP parse, the source and payload checks, jitter-buffer push (`on_datagram`)
- jitter tick: the buffer's pop and the exact 20 ms tick out of it, decode included
- decode: G.711 alone (a table look-up; part of the jitter tick, shown apart)
- resample in: 8 kHz → 24 kHz float (`FrameAssembler.push_pcm16`) and the slot's FIFO push
- tick, echo: a quarter of the 80 ms tick's work for this leg (take, step, `on_output`)
- playout: 20 ms out of the playout buffer
- resample out: 24 kHz → 8 kHz int16 (`ChunkResampler.convert`)
- encode: G.711
- pacing: `Pacer.take_due`
- send: the RTP header, `sendto` on the leg's socket

The sum of the stages runs a little over the whole (each has its own timer calls). Take
the lowest of `--rounds` rounds: on a shared machine the others are someone else's time.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from aiortc.rtp import RtpPacket

from agent.leg import prepare_config
from agent.media_agent import MediaAgent
from agent.plugins.base import SessionConfig
from agent.plugins.echo import EchoPlugin
from agent.telephony.codec import codec_by_name
from agent.telephony.rtp_leg import RtpLeg, RtpProtocol, RtpSettings
from agent.testing.testsignal import make_test_signal

STAGES = ("receive", "jitter tick", "decode", "resample in", "tick, echo", "playout",
          "resample out", "encode", "pacing", "send")
TICK_PACKETS = 4  # 80 ms ticks of 20 ms packets


def datagrams(codec: Any, count: int) -> list[bytes]:
    pcm = (make_test_signal(count * 0.02 + 0.1, codec.sample_rate) * 32767).astype(np.int16)
    step = codec.samples_per_chunk
    return [RtpPacket(payload_type=codec.payload_type, sequence_number=n & 0xFFFF,
                      timestamp=n * step, ssrc=0x1234, payload=codec.encode(
                          pcm[n * step:(n + 1) * step])).serialize() for n in range(count)]


async def open_leg(agent: MediaAgent, codec: Any, sink: tuple[str, int],
                   source: tuple[str, int]) -> RtpLeg:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        RtpProtocol, local_addr=("127.0.0.1", 0))
    leg = RtpLeg(agent, codec, transport, transport.get_extra_info("sockname")[:2], source,
                 RtpSettings(), dtmf_payload_type=None)
    protocol.leg = leg
    leg.remote = sink  # answer to the sink; take packets from `source`
    leg.strict_remote_port = False
    await leg.open_plugin_slot(await prepare_config(leg.plugin, SessionConfig()))
    return leg


def tick(leg: RtpLeg, silence: np.ndarray) -> None:
    """The ticker's work for this one leg: its frame, the plugin step, the answer."""
    assert leg.slot is not None
    outputs = leg.plugin.step([(leg.slot.plugin_session, leg.slot.take(silence))])
    leg.on_output(outputs[0])


def whole_path(leg: RtpLeg, packets: list[bytes], source: tuple[str, int],
               silence: np.ndarray) -> float:
    """µs per packet pair, the leg's own calls in a row."""
    started = time.perf_counter()
    now = 1000.0
    for index, data in enumerate(packets):
        leg.on_datagram(data, source)
        if index % TICK_PACKETS == 0:
            tick(leg, silence)
        leg._send_due(now, now)
        now += 0.02
    return (time.perf_counter() - started) / len(packets) * 1e6


def by_stage(leg: RtpLeg, packets: list[bytes], source: tuple[str, int],
             silence: np.ndarray) -> dict[str, float]:
    """µs per packet pair of each stage, the same calls the path makes, timed one by one."""
    totals = dict.fromkeys(STAGES, 0)
    clock = time.perf_counter_ns
    codec, inbound, pacer = leg.codec, leg.inbound, leg.pacer
    chunk = leg.chunk_samples
    now = 1000.0
    overhead = min(-clock() + clock() for _ in range(1000))

    def timed(stage: str, call: Callable[..., Any], *args: Any) -> Any:
        started = clock()
        result = call(*args)
        totals[stage] += clock() - started - overhead
        return result

    for index, data in enumerate(packets):
        timed("receive", leg.on_datagram, data, source)
        if index % TICK_PACKETS == 0:
            timed("tick, echo", tick, leg, silence)
        timed("pacing", pacer.take_due, now, now)
        audio = timed("playout", leg.playout.pop, chunk)
        pcm = timed("resample out", leg.resampler.convert, audio)
        payload = timed("encode", codec.encode, pcm)
        heard = timed("jitter tick", inbound.tick, codec.decode)
        timed("decode", codec.decode, payload)
        if heard is not None:
            timed("resample in", lambda p: leg.push_caller_audio(
                leg.assembler.push_pcm16(p, codec.sample_rate)), heard)
        timed("send", getattr(leg, "_send_packet", None) or partial(_send_as_before, leg),
              payload)
        now += 0.02
    return {stage: total / len(packets) / 1000 for stage, total in totals.items()}


def _send_as_before(leg: RtpLeg, payload: bytes) -> None:
    """The send stage of a leg without `_send_packet` (before it had one): the packet as its
    `_send_one` built it, through aiortc's RtpPacket."""
    packet = RtpPacket(payload_type=leg._payload_type, marker=0,
                       sequence_number=leg._sequence, timestamp=leg._timestamp,
                       ssrc=leg._ssrc, payload=payload)
    leg._sequence = (leg._sequence + 1) & 0xFFFF
    leg._timestamp = (leg._timestamp + leg.codec.rtp_samples_per_chunk) & 0xFFFFFFFF
    assert leg.remote is not None
    leg.socket.sendto(packet.serialize(), leg.remote)
    leg.packets_sent += 1


async def measure(codec_name: str, count: int, rounds: int) -> tuple[float, dict[str, float]]:
    codec = codec_by_name(codec_name)
    assert codec is not None
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setblocking(False)
    source = ("127.0.0.1", 40000)
    plugin = EchoPlugin()
    agent = MediaAgent(plugin)
    await agent.start()
    silence = plugin.silence_frame()
    packets = datagrams(codec, count)
    whole, stages = float("inf"), dict.fromkeys(STAGES, float("inf"))
    try:
        for _ in range(rounds):
            for measure_whole in (True, False):
                leg = await open_leg(agent, codec, sink.getsockname(), source)
                try:
                    if measure_whole:
                        whole = min(whole, whole_path(leg, packets, source, silence))
                    else:
                        found = by_stage(leg, packets, source, silence)
                        stages = {s: min(stages[s], found[s]) for s in STAGES}
                finally:
                    await leg.close("bench")
                while True:  # drain the sink between rounds
                    try:
                        sink.recv(4096)
                    except BlockingIOError:
                        break
    finally:
        sink.close()
    return whole, stages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packets", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--codec", default="PCMU")
    args = parser.parse_args()
    whole, stages = asyncio.run(measure(args.codec, args.packets, args.rounds))
    print(f"| stage ({args.codec}, echo plugin) | µs per packet pair |")
    print("|---|---|")
    for stage in STAGES:
        print(f"| {stage} | {stages[stage]:.1f} |")
    print(f"| sum of the stages (decode counted once) | "
          f"{sum(stages.values()) - stages['decode']:.1f} |")
    print(f"| **whole path** | **{whole:.1f}** |")


if __name__ == "__main__":
    main()
