"""sipp places 100 calls at 10 calls a second, each streaming PCMU from a WAV (sipp's
`rtp_stream`) to the echo plugin for a second and hanging up: 0 failed calls, every call
answered and heard, and `/health`'s SIP counts (transactions, dialogs, legs, tasks) back to
0 afterwards. Short SIP timers (T1 = 100 ms, so Timers J and K end within 6.4 s) keep the
wait for the last transactions short. Without sipp this skips (and fails under CI)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.testing.testsignal import make_test_signal
from signaling.sip.config import SipConfig
from signaling.sip.timers import TimerSettings
from tests.sip import scenarios
from tests.sip.helpers import SipServer, SipServerFactory, run_sipp, write_mulaw_wav
from tests.support.agents import wait_until

pytestmark = [pytest.mark.interop, pytest.mark.slow]

CALLS = 100
RATE = 10  # calls a second
PLAY_MS = 1000


def load_call(wav: str) -> str:
    """Call (the offer names sipp's own media port), stream the WAV, hang up."""
    body = (scenarios.establish("[media_port]")
            + f'  <nop><action><exec rtp_stream="{wav},1,0"/></action></nop>\n'
            + f'  <pause milliseconds="{PLAY_MS + 200}"/>\n' + scenarios.hang_up())
    return scenarios.scenario("load", body)


async def sip_health(server: SipServer) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(server.url + "/health") as reply:
        return dict((await reply.json())["sip"])


def all_zero(sip: dict[str, Any]) -> bool:
    return (sip["transactions"] == {"server": 0, "client": 0} and sip["dialogs"] == 0
            and sip["legs"] == 0 and sip["tasks"] == 0)


async def test_100_calls_at_10_per_second_with_pcmu_audio_and_nothing_left(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    server = await start_sip(config=SipConfig(listen_port=0, timers=TimerSettings(t1=0.1)))
    write_mulaw_wav(tmp_path / "speech.wav", make_test_signal(PLAY_MS / 1000, 8000))
    heard: set[str] = set()  # legs that took sipp's RTP in (latched onto its source)

    async def watch() -> None:
        while True:
            heard.update(leg.id for leg in list(server.agent.legs)
                         if leg.stats().get("remote_source"))
            await asyncio.sleep(0.1)

    watcher = asyncio.ensure_future(watch())
    try:
        run = await run_sipp(server.sip, tmp_path, "-r", str(RATE), "-m", str(CALLS),
                             "-l", "40", scenario=load_call("speech.wav"), timeout=28)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    assert run.returncode == 0, run.explain()  # sipp: every call succeeded
    counters = server.ua.stats()["counters"]
    assert counters["answered"] == CALLS, counters  # type: ignore[index]
    assert counters["remote_hangups"] == CALLS, counters  # type: ignore[index]
    assert server.agent.metrics.calls_started.labels("sip", "echo")._value.get() == CALLS
    assert len(heard) == CALLS, f"{CALLS - len(heard)} calls never received sipp's RTP"
    await wait_until(lambda: not server.agent.legs)
    sip = await sip_health(server)
    for _ in range(200):  # the last transactions' Timers J/K (64 * T1)
        if all_zero(sip):
            break
        await asyncio.sleep(0.05)
        sip = await sip_health(server)
    assert all_zero(sip), sip
    assert sip["internal_errors"] == 0
    assert sip["invite_limit"].get("invites_limited", 0) == 0
    print(f"\nsipp {CALLS} calls at {RATE}/s: 0 failed; /health sip {sip}")
