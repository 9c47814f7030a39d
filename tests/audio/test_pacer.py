from __future__ import annotations

import numpy as np
from aiortc.codecs.g711 import PcmuEncoder
from aiortc.codecs.opus import OpusEncoder

from agent.audio.pacer import Pacer
from agent.audio.playout import PlayoutBuffer
from agent.webrtc.outbound import AgentAudioTrack
from tests.support.clock import FakeClock


async def test_an_hour_of_pacing_has_no_drift() -> None:
    clock = FakeClock(start=5000.0)
    pacer = Pacer(clock, 0.02)
    start = clock.now()
    packets = 3600 * 50
    for index in range(packets):
        await pacer.wait_next()
        # Every due time is exact: anchor + n * period, not a running sum.
        if index % 10_000 == 0:
            assert clock.now() == start + index * 0.02
    assert abs(clock.now() - (start + (packets - 1) * 0.02)) < 1e-9
    assert pacer.reanchors == 0


async def test_pacer_waits_when_early_and_reanchors_after_a_stall() -> None:
    clock = FakeClock()
    pacer = Pacer(clock, 0.02, max_lateness=0.1)
    await pacer.wait_next()
    t0 = clock.now()
    await pacer.wait_next()
    assert clock.now() == t0 + 0.02
    clock.advance(1.0)  # the process was suspended for a second
    await pacer.wait_next()
    assert pacer.reanchors == 1
    resumed = clock.now()
    await pacer.wait_next()
    # No burst: the next packet is a full period after the re-anchored one.
    assert clock.now() == resumed + 0.02


async def test_late_sends_count_packets_that_would_leave_a_hole_over_60_ms() -> None:
    clock = FakeClock()
    pacer = Pacer(clock, 0.02, max_lateness=0.1)
    for _ in range(10):
        await pacer.wait_next()
    clock.advance(0.02 + 0.03)  # the next one goes out 30 ms late: a 50 ms hole, not counted
    await pacer.wait_next()
    assert pacer.late_sends == 0
    clock.advance(0.02 + 0.05)  # 50 ms late: a 70 ms hole, counted; the burst that catches
    await pacer.wait_next()  # up after it leaves no hole
    await pacer.wait_next()
    await pacer.wait_next()
    assert pacer.late_sends == 1
    clock.advance(1.0)  # a stall the pacer re-anchors after: counted too
    await pacer.wait_next()
    assert (pacer.late_sends, pacer.reanchors) == (2, 1)


async def test_track_sends_silence_on_underrun_with_continuous_timestamps() -> None:
    clock = FakeClock()
    playout = PlayoutBuffer(24000)
    track = AgentAudioTrack(playout, 24000, clock=clock)
    playout.push(np.full(480, 0.5, dtype=np.float32))
    frames = [await track.recv() for _ in range(3)]
    assert [f.pts for f in frames] == [0, 480, 960]
    assert frames[0].to_ndarray().max() > 16000
    assert frames[1].to_ndarray().max() == 0 and frames[2].to_ndarray().max() == 0
    assert playout.underrun_chunks == 2
    track.stop()


async def test_track_inline_encoder_emits_one_packet_per_chunk() -> None:
    # pts count the RTP clock (48 kHz for Opus at any encoding rate), as aiortc stamps them
    for mime, clock_rate, step in (("audio/opus", 48000, 960), ("audio/PCMU", 8000, 160)):
        playout = PlayoutBuffer(24000)
        track = AgentAudioTrack(playout, 24000, clock=FakeClock())
        track.use_inline_encoder(mime)
        playout.push(np.random.default_rng(0).uniform(-0.3, 0.3, 4800).astype(np.float32))
        packets = [await track.recv() for _ in range(15)]
        assert [p.pts for p in packets] == [i * step for i in range(15)]
        assert all(p.size > 0 for p in packets)
        assert packets[0].time_base.denominator == clock_rate
        # aiortc's packer turns them into the RTP timestamps it would have stamped itself
        packer = OpusEncoder() if mime == "audio/opus" else PcmuEncoder()
        assert [packer.pack(p)[1] for p in packets[:3]] == [0, step, 2 * step]
        track.stop()
