"""Upstream URLs with credentials: used to connect, never printed or served verbatim."""

from __future__ import annotations

import asyncio
import logging
import socket

import aiohttp
import pytest

from agent.plugins.remote.vllm_omni import VllmOmniPlugin
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory

from .conftest import StartFake
from .test_calls import SETTINGS, all_gone, call_stats

SECRETS = ("hunter2", "sk-leak", "pw-leak", "tk-leak")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _assert_clean(text: str) -> None:
    assert not [secret for secret in SECRETS if secret in text], text


async def test_credentials_stay_out_of_health_stats_errors_and_logs(
    start_agent: AgentFactory, start_fake: StartFake, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    fake = await start_fake("vllm")
    good = fake.url.replace("ws://", "ws://user:hunter2@") + "&api_key=sk-leak"
    dead = f"ws://admin:pw-leak@127.0.0.1:{_closed_port()}/v1/realtime?token=tk-leak"
    running = await start_agent(VllmOmniPlugin([good], settings=SETTINGS))
    broken = await start_agent(VllmOmniPlugin([dead], settings=SETTINGS))

    call = asyncio.ensure_future(run_call(running.url, seconds=2.0))
    await asyncio.sleep(1.0)
    stats = await call_stats(running)
    report, _, _ = await call
    assert report.ok, report.error  # the real URL (with its credentials) still connects
    assert stats and "***@" in stats[0]["plugin_session"]["upstream"]
    _assert_clean(repr(stats))

    failed, _, _ = await run_call(broken.url, seconds=0.5)
    assert failed.error is not None
    _assert_clean(failed.error)
    async with aiohttp.ClientSession() as http:
        for server in (running, broken):
            async with http.get(server.url + "/health") as response:
                health = await response.text()
            assert "***" in health
            _assert_clean(health)
    _assert_clean(caplog.text)
    assert "***@127.0.0.1" in caplog.text  # the failure was logged, masked
    await all_gone(running)
