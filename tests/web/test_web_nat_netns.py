"""The browser through real NATs: headless Chromium in the "home" namespace, masqueraded
behind 198.51.100.20, loads the page from the agent's public address (the agent in its own
namespace behind a 1:1 NAT that lets in only its one `--rtc-udp-port`, tests/support/netns.py)
and calls it with host candidates only: no STUN anywhere, `--rtc-advertise` does it.

Then the network changes mid-call, two ways:

- the home NAT's public address moves to 198.51.100.21 (its conntrack flushed, so the call's
  flow leaves from the new address at once): a NAT rebinding, invisible to Chromium. The
  agent's mux drops the media from the unvalidated address and its answers go to the old
  one, which refuses them, until Chromium's next ICE check validates the new address;
- the caller's own address changes as well (10.231.2.2 -> .3: Wi-Fi to cellular): the path
  Chromium had is dead, and only an ICE restart brings the call back. The page restarts by
  itself (web/restart.js: a second without inbound audio, or "disconnected" for 2 s).

Either way the call goes on: the same call id at the agent and in the page's call resource,
one session.created, audio flowing again from the new address. The time from the change to
the restart request, from the request to audio again, and the audio gap are printed
(measured inside the page, getStats every 20 ms), not asserted; benchmarks/
nat_restart_bench.py repeats them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from tests.support import SPEECH_WAV
from tests.support.chromium import PageLog
from tests.support.netns import HOME_NAT_SWITCHED, NatLab, nat_lab, require_netns
from tests.support.netns_browser import (
    MUX_PORT,
    UI_TIMEOUT_MS,
    agent_calls,
    chromium_in_namespace,
    packets_now,
    probe,
    recovery,
    start_call,
    wait_for_audio,
)
from tests.web.test_web_page import assert_clean, needs_chromium

pytestmark = [pytest.mark.slow, pytest.mark.interop]  # ip, nftables, conntrack, Chromium


def conntrack_problem() -> str | None:
    if shutil.which("conntrack") is None:
        return "conntrack is not installed (scripts/install-test-deps.sh installs it)"
    return None


@pytest.fixture(autouse=True)
def namespaces_possible() -> None:
    require_netns()
    problem = conntrack_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the network-change test cannot run under CI: {problem}",
                        pytrace=False)
        pytest.skip(problem)


@pytest.fixture
async def lab() -> AsyncIterator[NatLab]:
    async with nat_lab([MUX_PORT]) as running:
        yield running


@pytest.fixture
async def browser(lab: NatLab, tmp_path: Path) -> AsyncIterator[Browser]:
    async with chromium_in_namespace(lab.home, SPEECH_WAV, lab.public_url, tmp_path) as running:
        yield running


async def the_same_call_goes_on(lab: NatLab, page: Page, log: PageLog, call_id: str
                                ) -> tuple[dict[str, Any], int]:
    """Audio flows again on the same call (one session.created, the same id at the agent
    and in the page's call resource); then hang up cleanly. The page's probe and its ICE
    restart count before hangup."""
    await wait_for_audio(page, await packets_now(page))
    info = await probe(page)
    restarts = await page.evaluate("window.voiceApp.iceRestarts")
    await expect(page.locator("#status")).to_have_attribute("data-ice-restarts",
                                                            str(restarts))
    # The call's packets now cross from the home's new public address.
    flows = lab.ns(lab.agent_nat, "conntrack", "-L", "-p", "udp", "-s", HOME_NAT_SWITCHED)
    assert f"dport={MUX_PORT}" in flows, flows
    calls = await agent_calls(page)
    assert [c["call_id"] for c in calls] == [call_id], calls
    assert calls[0]["connection_state"] == "connected", calls
    assert info["events"].count("session.created") == 1, info["events"]
    location = await page.evaluate("window.voiceApp.call.location")
    assert location.endswith("/" + call_id)
    await page.click("#hangup")
    await expect(page.locator("#status")).to_have_text("Call ended.", timeout=UI_TIMEOUT_MS)
    assert_clean(log)
    return info, restarts


@needs_chromium
async def test_a_nat_rebinding_mid_call_keeps_the_call(
        lab: NatLab, browser: Browser) -> None:
    """The home NAT's public address changes; the caller's own address does not, so
    Chromium's path looks the same to it. Its next ICE check reaches the agent from the new
    address and validates it there; the agent's answers follow (often before the page's
    silence restart is due, then with no restart at all)."""
    page, log, call_id = await start_call(lab, browser)
    changed = await page.evaluate("performance.now()")
    lab.switch_home_address()
    info, restarts = await the_same_call_goes_on(lab, page, log, call_id)
    measured = recovery(info, changed)
    print(f"\nNAT rebinding: {measured.line()}\n  states {measured.states}")
    # Either the agent follows Chromium's next check to the new address first, or the page's
    # silence restart (1 s) does it: one restart at most, never a new call.
    assert restarts <= 1 and len(info["restarts"]) == restarts, (restarts, measured)


@needs_chromium
async def test_the_page_restarts_ice_when_its_network_changes(
        lab: NatLab, browser: Browser) -> None:
    """The caller's own address moves (and its NAT's with it): the path Chromium had is
    dead, the page restarts ICE on the same call resource by itself, and the call goes on."""
    page, log, call_id = await start_call(lab, browser)
    changed = await page.evaluate("performance.now()")
    lab.switch_home_network()
    await expect(page.locator("#status")).to_have_text("Reconnected: the call goes on.",
                                                       timeout=30_000)
    info, restarts = await the_same_call_goes_on(lab, page, log, call_id)
    measured = recovery(info, changed)
    print(f"\nnetwork change: {measured.line()}\n  states {measured.states}")
    assert measured.restart_request_ms is not None and restarts >= 1, measured
