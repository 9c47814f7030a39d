"""The page in real headless Firefox (Debian firefox-esr): it loads clean, calls the agent,
hears it, meters and stats work, and Hang up ends the server-side session.

Firefox's fake microphone plays a tone; the echo plugin sends it back. Not checked here: the
level meters and recording, which need Web Audio running, and headless Firefox in a
container with no sound device keeps its AudioContext suspended (the Chromium tests cover
them).
"""

from __future__ import annotations

import pytest

from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.firefox_bidi import firefox_page, firefox_path

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(firefox_path() is None,
                       reason="Firefox is not installed (apt install firefox-esr)"),
]

INBOUND_AUDIO = """(async () => {
    const report = await window.voiceApp.call.pc.getStats();
    for (const s of report.values()) {
        if (s.type === "inbound-rtp" && s.kind === "audio") {
            return {bytes: s.bytesReceived || 0, level: s.audioLevel || 0};
        }
    }
    return {bytes: 0, level: 0};
})()"""


async def test_call_in_firefox(start_agent: AgentFactory) -> None:
    running = await start_agent()
    async with firefox_page(running.url + "/") as page:
        await page.wait_for("document.getElementById('agent-info').textContent === 'Agent: echo'")
        await page.click("#call")
        await page.wait_for("document.getElementById('status').textContent.startsWith('Connected')",
                            timeout=30)
        assert len(running.agent.webrtc_legs) == 1
        call = next(iter(running.agent.webrtc_legs.values()))
        await page.wait_for(f"{INBOUND_AUDIO}.then((a) => a.bytes > 4000 && a.level > 0.001)")
        # Firefox's stats shape (no transport entry; a `selected` pair) fills the panel too.
        await page.wait_for(
            "/^\\d/.test(document.querySelector('#stats dd[data-stat=round-trip]').textContent)"
        )
        codec = await page.evaluate(
            "document.querySelector('#stats dd[data-stat=codec]').textContent"
        )
        assert codec.startswith("opus")
        await page.click("#hangup")
        await page.wait_for("document.getElementById('status').textContent === 'Call ended.'")
        await wait_until(lambda: all_freed(running), timeout=5)
        assert call.end_reason == "hangup"
        assert page.console_errors == []
