"""The moshi-server plugin against the two reference servers' query handling (fakes cite
NVIDIA's and Kyutai's `moshi/server.py`)."""

from __future__ import annotations

import pytest

from agent.plugins.base import PluginError, PluginOptions, SessionConfig
from agent.plugins.moshi_defaults import DEFAULT_PERSONA, DEFAULT_VOICE
from agent.plugins.remote.link import LinkSettings
from agent.plugins.remote.moshi_server import MoshiServerPlugin, visible_text
from tests.support.agents import wait_until
from tests.support.fake_engines import Behaviour

from .conftest import StartFake
from .driver import Driver

FAST = LinkSettings(connect_timeout=2.0, handshake_timeout=2.0, stall_timeout=0.6)


def plugin_for(url: str, kind: str = "personaplex", voice: str | None = None) -> MoshiServerPlugin:
    plugin = MoshiServerPlugin.from_options(PluginOptions(
        upstreams=(url,), voice=voice,
        extra={"upstream_kind": kind, "upstream_handshake_timeout": 2.0,
               "upstream_stall_timeout": 0.6}))
    assert isinstance(plugin, MoshiServerPlugin)
    return plugin


async def test_personaplex_server_always_gets_a_voice_and_a_persona(start_fake: StartFake) -> None:
    fake = await start_fake("moshi", Behaviour(nvidia_prompts=True))
    driver = Driver(plugin_for(fake.url))
    session = await driver.open(SessionConfig())  # the caller set neither
    assert fake.sessions[0].query == {"voice_prompt": DEFAULT_VOICE, "text_prompt": DEFAULT_PERSONA}
    await driver.close(session)
    await wait_until(lambda: driver.plugin.pool.describe()[0]["active"] == 0)  # one at a time
    session = await driver.open(SessionConfig(voice="NATM1.pt", instructions="  Be brief. "))
    assert fake.sessions[1].query == {"voice_prompt": "NATM1.pt", "text_prompt": "Be brief."}
    await driver.close(session)
    await driver.shutdown()


async def test_kyutai_server_gets_no_query_it_would_not_read(start_fake: StartFake) -> None:
    fake = await start_fake("moshi", Behaviour())
    driver = Driver(plugin_for(fake.url, kind="kyutai"))
    session = await driver.open(SessionConfig(voice="NATM1.pt", instructions="Be brief."))
    assert fake.sessions[0].query == {}
    await driver.close(session)
    await driver.shutdown()


async def test_a_session_the_server_refuses_is_a_call_error_not_a_server_failure(
    start_fake: StartFake,
) -> None:
    fake = await start_fake("moshi", Behaviour(nvidia_prompts=True))
    driver = Driver(plugin_for(fake.url))
    with pytest.raises(PluginError) as refused:
        await driver.open(SessionConfig(voice="NOSUCH.pt"))
    assert (refused.value.code, refused.value.status) == ("upstream_refused_session", 400)
    upstream = driver.plugin.pool.describe()[0]
    assert upstream["healthy"] is True and upstream["failures"] == 0
    # The next caller is served at once by the same, healthy server.
    session = await driver.open(SessionConfig())
    await driver.close(session)
    await driver.shutdown()


async def test_control_pieces_stay_out_of_the_transcript(start_fake: StartFake) -> None:
    fake = await start_fake("moshi", Behaviour(control_pieces=True, text_every=2))
    driver = Driver(plugin_for(fake.url))
    session = await driver.open(SessionConfig())
    outputs = await driver.run_until(session, lambda outs: "word3" in "".join(o.text for o in outs))
    text = "".join(o.text for o in outputs)
    assert "<s>" not in text and text.startswith(" word1 word2")
    await driver.close(session)
    await driver.shutdown()


def test_visible_text_drops_control_symbols_only() -> None:
    assert visible_text("<s>") == "" and visible_text("</s> hello") == " hello"
    assert visible_text(" a < b and c > d") == " a < b and c > d"
