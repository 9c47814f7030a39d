"""A real call through the real server (aiortc peer over 127.0.0.1) to the personaplex plugin
on a tiny checkpoint: the model's own audio comes back, not an echo."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.plugins.personaplex.plugin import PersonaPlexPlugin
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory, all_freed, wait_until

pytestmark = pytest.mark.model


async def test_call_gets_model_audio(start_agent: AgentFactory, tiny_checkpoint: Path) -> None:
    running = await start_agent(PersonaPlexPlugin(str(tiny_checkpoint), max_sessions=2))
    await running.agent.start()
    report, sent, received = await run_call(
        running.url, seconds=3.0, session={"voice": "NATM1.pt", "instructions": "Be brief."}
    )
    assert report.ok, report.error
    assert report.events[0] == "session.created"
    assert report.seconds_received >= 2.0
    # Random weights speak noise, not the caller's test signal back.
    assert report.correlation is None or report.correlation < 0.5
    assert float(np.abs(received[24000:]).max()) > 1e-3
    await wait_until(lambda: all_freed(running))


async def test_bad_voice_is_refused_at_offer(
    start_agent: AgentFactory, tiny_checkpoint: Path
) -> None:
    running = await start_agent(PersonaPlexPlugin(str(tiny_checkpoint), max_sessions=1))
    await running.agent.start()
    report, _, _ = await run_call(
        running.url, seconds=1.0, session={"voice": "../../etc/passwd.pt"}
    )
    assert not report.ok
    assert report.error is not None and "invalid_voice" in report.error
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/v1/models") as response:
            body = await response.json()
    assert body["data"][0]["voices"] == ["NATF2.pt", "NATM1.pt", "VARF0.pt"]
