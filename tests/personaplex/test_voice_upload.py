"""Voice recordings uploaded with an offer (multipart `voice_audio`), through the real server:
allowed only where `--max-voice-upload-bytes` says so, refused with a code otherwise, and used
as the call's voice prompt when allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.plugins.echo import EchoPlugin
from agent.plugins.personaplex.plugin import PersonaPlexPlugin
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.realtime import RealtimeClient

from .test_voice_audio import voice_recording

pytestmark = pytest.mark.model

LIMIT = 200_000


@pytest.fixture
def recording(tmp_path: Path) -> bytes:
    return voice_recording(tmp_path / "me.wav", seconds=1.0).read_bytes()


async def refusal(running: RunningAgent, session: dict[str, Any] | None,
                  voice_audio: bytes) -> tuple[int, dict[str, Any]]:
    client = RealtimeClient(running.url)
    try:
        async with aiohttp.ClientSession() as http:
            response = await client.post(http, await client.offer_sdp(), session,
                                         voice_audio=voice_audio)
            async with response:
                return response.status, (await response.json())["error"]
    finally:
        await client.close()


async def test_an_uploaded_voice_is_the_calls_prompt(
        start_agent: AgentFactory, tiny_checkpoint: Path, recording: bytes,
        realtime_clients: list[RealtimeClient]) -> None:
    running = await start_agent(PersonaPlexPlugin(str(tiny_checkpoint), max_sessions=2),
                                voice_upload_bytes=LIMIT)
    await running.agent.start()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{running.url}/v1/models") as response:
            assert (await response.json())["data"][0]["capabilities"]["voice_upload"] is True
    client = RealtimeClient(running.url)
    realtime_clients.append(client)
    await client.call({"instructions": "Be brief."}, voice_audio=recording)
    created = await client.wait_event("session.created")
    assert created["session"]["voice"].startswith("upload-")
    await client.wait_audio(1.0)
    # Unreadable recordings, and a voice named as well, are the caller's mistakes.
    status, error = await refusal(running, None, b"RIFF not really a wave file")
    assert (status, error["code"], error["param"]) == (400, "invalid_voice_audio", "voice_audio")
    status, error = await refusal(running, {"voice": "NATF2.pt"}, recording)
    assert (status, error["code"]) == (400, "conflicting_voice")
    status, error = await refusal(running, None, recording + bytes(LIMIT))
    assert (status, error["code"]) == (413, "body_too_large")
    await client.close()
    await wait_until(lambda: all_freed(running))


async def test_uploads_are_refused_unless_allowed_and_supported(
        start_agent: AgentFactory, recording: bytes) -> None:
    closed = await start_agent(EchoPlugin())
    status, error = await refusal(closed, None, recording)
    assert (status, error["code"], error["param"]) == (403, "voice_upload_disabled", "voice_audio")
    echo = await start_agent(EchoPlugin(), voice_upload_bytes=LIMIT)
    status, error = await refusal(echo, None, recording)
    assert (status, error["code"]) == (400, "voice_upload_unsupported")
    await wait_until(lambda: all_freed(echo) and all_freed(closed))
