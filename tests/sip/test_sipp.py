"""The agent's SIP side against sipp, a SIP implementation nobody here wrote: calls with
audio echoed back, CANCEL, INVITE retransmissions, hold/resume, BYE either way, OPTIONS, an
unknown dialog and a burst of calls. sipp runs on 127.0.0.1, bounded in time, killed by PID;
without sipp these tests skip (and fail under CI)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.telephony.codec import PCMU
from agent.testing.testsignal import make_test_signal, measure_echo
from signaling.sip.config import SipConfig
from tests.sip import scenarios
from tests.sip.helpers import (
    RtpProbe,
    SipServer,
    SipServerFactory,
    run_sipp,
    write_mulaw_wav,
)
from tests.support.agents import wait_until

pytestmark = pytest.mark.interop


def with_port(xml: str, port: int) -> str:
    return xml.replace("__MEDIA_PORT__", str(port))


def calls_started(server: SipServer) -> float:
    return server.agent.metrics.calls_started.labels("sip", "echo")._value.get()


@pytest.mark.slow
async def test_a_sipp_call_with_pcmu_audio_comes_back_through_the_echo_plugin(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    probe = await RtpProbe.open()  # where the offer says sipp receives RTP
    signal = make_test_signal(4.0, 8000)
    sent = PCMU.decode(write_mulaw_wav(tmp_path / "speech.wav", signal))
    xml = with_port(scenarios.call_with_echo("speech.wav", 5000), probe.port)
    run = await run_sipp(sip_server.sip, tmp_path, "-m", "1", scenario=xml, timeout=30)
    assert run.returncode == 0, run.explain()
    received = probe.audio()
    assert len(received) >= 4.0 * 8000, len(received)  # 20 ms packets for the whole call
    echo = measure_echo(sent.astype(np.float32) / 32768, received, 8000)
    assert echo.correlation >= 0.8, echo
    print(f"\nsipp PCMU echo: correlation {echo.correlation:.3f}, lag {echo.lag_seconds:.3f} s")
    assert {p.payload_type for p in probe.packets} == {0}
    await wait_until(sip_server.quiet)
    assert calls_started(sip_server) == 1
    probe.close()


async def test_cancel_before_the_answer(start_sip: SipServerFactory, tmp_path: Path) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, ring_seconds=3.0))
    probe = await RtpProbe.open()
    xml = with_port(scenarios.cancel_before_answer(), probe.port)
    run = await run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml, timeout=20)
    assert run.returncode == 0, run.explain()
    assert run.count("SIP/2.0 487", "received") == 1
    await asyncio.sleep(3.2)  # past the ring time: nothing was answered after all
    assert run.count("SIP/2.0 200 OK") == 1  # the CANCEL's
    assert server.quiet() and server.ua.counters["cancelled"] == 1
    assert server.ua.counters["answered"] == 0
    probe.close()


async def test_sipp_deaf_to_provisionals_retransmits_its_invite_and_makes_one_call(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, ring_seconds=2.0))
    probe = await RtpProbe.open()
    xml = with_port(scenarios.deaf_to_provisionals(), probe.port)
    run = await run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml, timeout=20)
    assert run.returncode == 0, run.explain()
    assert run.count("INVITE sip:", "sent") >= 3  # 0, 0.5, 1.5 s: Timer A at work
    # Each copy was absorbed by the one INVITE transaction: the 180 resent, one call.
    assert run.count("SIP/2.0 180", "received") >= 3
    assert server.ua.counters["retransmissions_absorbed"] >= 2
    assert calls_started(server) == 1 and server.ua.counters["answered"] == 1
    await wait_until(server.quiet)
    probe.close()


async def test_hold_and_resume_by_reinvite(sip_server: SipServer, tmp_path: Path) -> None:
    probe = await RtpProbe.open()
    xml = with_port(scenarios.hold_and_resume(), probe.port)
    run = await run_sipp(sip_server.sip, tmp_path, "-m", "1", scenario=xml, timeout=20)
    assert run.returncode == 0, run.explain()
    assert sip_server.ua.counters["reinvites"] == 3
    await wait_until(sip_server.quiet)
    probe.close()


async def test_the_agent_hangs_up_over_http_and_sipp_gets_the_bye(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    probe = await RtpProbe.open()
    xml = with_port(scenarios.agent_hangs_up(), probe.port)
    sipp = asyncio.ensure_future(run_sipp(sip_server.sip, tmp_path, "-m", "1", scenario=xml,
                                          timeout=20))
    try:
        await wait_until(lambda: sip_server.ua.stats()["call_states"] == {"confirmed": 1})
        (leg,) = list(sip_server.agent.legs)
        async with (aiohttp.ClientSession() as http,
                    http.delete(f"{sip_server.url}/v1/realtime/calls/{leg.id}") as reply):
            assert reply.status == 200
        run = await sipp
    finally:
        sipp.cancel()
    assert run.returncode == 0, run.explain()
    assert run.count("BYE sip:sipp@127.0.0.1", "received") >= 1
    await wait_until(sip_server.quiet)
    probe.close()


async def test_the_media_timeout_ends_a_silent_call_with_a_bye(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, media_timeout=1.5))
    probe = await RtpProbe.open()
    xml = with_port(scenarios.agent_hangs_up(), probe.port)  # sipp sends no RTP at all
    run = await run_sipp(server.sip, tmp_path, "-m", "1", scenario=xml, timeout=20)
    assert run.returncode == 0, run.explain()
    assert 'text="media_timeout"' in run.messages
    await wait_until(server.quiet)
    probe.close()


async def test_options_and_a_bye_for_an_unknown_dialog(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    run = await run_sipp(sip_server.sip, tmp_path, "-m", "1", scenario=scenarios.options(),
                         timeout=10, name="options")
    assert run.returncode == 0, run.explain()
    run = await run_sipp(sip_server.sip, tmp_path, "-m", "1",
                         scenario=scenarios.unknown_dialog_bye(), timeout=10, name="unknown")
    assert run.returncode == 0, run.explain()
    assert sip_server.sip_legs() == 0


async def test_calls_over_tcp(sip_server: SipServer, tmp_path: Path) -> None:
    run = await run_sipp(sip_server.sip, tmp_path, "-sn", "uac", "-t", "t1", "-m", "2",
                         "-d", "500", timeout=20)
    assert run.returncode == 0, run.explain()
    assert sip_server.ua.counters["answered"] == 2
    assert sip_server.ua.counters["remote_hangups"] == 2
    await wait_until(sip_server.quiet)


async def test_a_burst_of_20_calls_at_10_per_second(
    sip_server: SipServer, tmp_path: Path,
) -> None:
    run = await run_sipp(sip_server.sip, tmp_path, "-sn", "uac", "-r", "10", "-m", "20",
                         "-d", "1000", "-l", "20", timeout=40)
    assert run.returncode == 0, run.explain()
    stats = sip_server.ua.stats()
    assert stats["counters"]["answered"] == 20  # type: ignore[index]
    assert calls_started(sip_server) == 20
    await wait_until(sip_server.quiet)
    async with aiohttp.ClientSession() as http:
        async with http.get(sip_server.url + "/health") as reply:
            health = await reply.json()
        async with http.get(sip_server.url + "/metrics/sip") as reply:
            sip = await reply.json()
    assert health["active_calls"] == 0 and health["legs"].get("sip", 0) == 0
    assert sip["calls"] == 0 and sip["invite_to_200_ms"]["count"] == 20
    print(f"\nINVITE->200 over 20 calls at 10/s: p50 {sip['invite_to_200_ms']['p50']} ms, "
          f"p95 {sip['invite_to_200_ms']['p95']} ms")
