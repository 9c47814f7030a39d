"""The page restarts ICE by itself when its network changes: real headless Chromium against a
real agent on 127.0.0.1. The agent's side of the path is closed mid-call (its ICE sockets
shut, as when an address goes away); Chromium notices, the page calls `pc.restartIce()` and
re-offers on the same call resource, and the call goes on."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, expect

from agent.media_agent import AgentSettings
from tests.support import SPEECH_WAV
from tests.support.agents import AgentFactory, wait_until
from tests.support.chromium import launch_chromium, open_page
from tests.web.test_web_page import (
    UI_TIMEOUT_MS,
    assert_clean,
    connect,
    needs_chromium,
    wait_for_inbound_audio,
)


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    async with launch_chromium(SPEECH_WAV) as browser:
        yield browser


@needs_chromium
@pytest.mark.slow
async def test_page_restarts_ice_when_the_path_breaks(start_agent: AgentFactory,
                                                      chromium: Browser) -> None:
    running = await start_agent(settings=AgentSettings(reconnect_seconds=30.0))
    page, log = await open_page(chromium, running.url + "/")
    await connect(page)
    await wait_for_inbound_audio(page)
    leg = next(iter(running.agent.webrtc_legs.values()))
    assert leg.ice.restartable is not None

    broken = time.monotonic()
    await leg.ice.restartable.connection.close()  # the agent's address for this call is gone
    await expect(page.locator("#status")).to_have_text("Reconnected: the call goes on.",
                                                       timeout=UI_TIMEOUT_MS)
    print(f"reconnected {time.monotonic() - broken:.1f} s after the path broke")
    await wait_for_inbound_audio(page)
    assert await page.evaluate("window.voiceApp.iceRestarts") >= 1
    await expect(page.locator("#status")).to_have_attribute("data-ice-restarts", "1")
    # The same call: one leg, the same id, restarted ICE; the page still holds its resource.
    assert list(running.agent.webrtc_legs.values()) == [leg] and not leg.closing
    assert (leg.ice.restarts_completed or 0) >= 1
    location = await page.evaluate("window.voiceApp.call.location")
    assert location.endswith("/" + leg.id)
    await page.click("#hangup")
    await expect(page.locator("#status")).to_have_text("Call ended.", timeout=UI_TIMEOUT_MS)
    await wait_until(lambda: leg.closed.is_set(), timeout=5)
    assert leg.end_reason == "hangup"
    assert_clean(log)
