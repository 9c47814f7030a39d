"""The browser page in real headless Chromium against a real agent on 127.0.0.1.

Chromium's fake microphone plays tests/fixtures/speech_16k.wav; the agent's ICE host
candidates are limited to 127.0.0.1 (conftest) and Chromium reaches them from its own host
candidates (peer-reflexive on the agent's side).
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import subprocess
import wave
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, expect

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings
from signaling.auth import AuthSettings

from chromium_browser import PageLog, chromium_path, launch_chromium, open_page
from support import AgentFactory, RunningAgent, all_freed, wait_until
from text_echo_plugin import TextEchoPlugin

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"
UI_TIMEOUT_MS = 15_000

needs_chromium = pytest.mark.skipif(chromium_path() is None,
                                    reason="Chromium is not installed (apt install chromium)")


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    async with launch_chromium() as browser:
        yield browser


async def inbound_audio(page: Page) -> dict[str, Any]:
    """What Chromium's getStats says about the agent's audio arriving at the page."""
    return await page.evaluate("""async () => {
        const pc = window.voiceApp.call && window.voiceApp.call.pc;
        if (!pc) return {bytesReceived: 0, audioLevel: 0, totalAudioEnergy: 0};
        const report = await pc.getStats();
        for (const s of report.values()) {
            if (s.type === "inbound-rtp" && s.kind === "audio") {
                return {bytesReceived: s.bytesReceived || 0, audioLevel: s.audioLevel || 0,
                        totalAudioEnergy: s.totalAudioEnergy || 0};
            }
        }
        return {bytesReceived: 0, audioLevel: 0, totalAudioEnergy: 0};
    }""")


async def wait_for_inbound_audio(page: Page, timeout: float = 15.0) -> dict[str, Any]:
    """Poll until bytes arrive AND Chromium measures a non-zero level on them."""
    deadline = asyncio.get_running_loop().time() + timeout
    first = await inbound_audio(page)
    while True:
        now = await inbound_audio(page)
        if (now["bytesReceived"] > first["bytesReceived"] + 4000
                and now["totalAudioEnergy"] > 0 and now["audioLevel"] > 0.001):
            return now
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no audible inbound audio: first={first} last={now}")
        await asyncio.sleep(0.25)


async def active_calls(running: RunningAgent) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/health") as response:
            return (await response.json())["active_calls"]


async def connect(page: Page) -> None:
    await page.click("#call")
    await expect(page.locator("#status")).to_contain_text("Connected", timeout=UI_TIMEOUT_MS)


def assert_clean(log: PageLog) -> None:
    assert log.page_errors == [], log.page_errors
    assert log.console_errors == [], log.console_errors


def wav_channels(data: bytes) -> tuple[int, np.ndarray]:
    with wave.open(io.BytesIO(data)) as wav:
        assert wav.getsampwidth() == 2
        channels, rate = wav.getnchannels(), wav.getframerate()
        samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    return rate, samples.reshape(-1, channels).T.astype(np.float32) / 32768


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js (>= 18) is not installed")
def test_javascript_unit_tests_pass() -> None:
    result = subprocess.run(
        ["node", "--test", "web/tests/"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout


@needs_chromium
async def test_page_loads_clean_and_lists_the_agent(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log = await open_page(chromium, running.url + "/")
    await expect(page.locator("#agent-info")).to_have_text("Agent: echo", timeout=UI_TIMEOUT_MS)
    await expect(page.locator("#voice-note")).to_contain_text("no voices")
    await expect(page.locator("#voice")).to_be_disabled()
    await expect(page.locator("#call")).to_be_enabled()
    await expect(page.locator("#hangup")).to_be_disabled()
    for box in ("#echo-cancellation", "#noise-suppression", "#auto-gain"):
        await expect(page.locator(box)).to_be_checked()
    await expect(page.locator("#stats dd[data-stat=state]")).to_have_text("idle")
    assert_clean(log)


@needs_chromium
async def test_call_plays_agent_audio_records_and_hangs_up(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log = await open_page(chromium, running.url + "/")
    await connect(page)
    assert len(running.agent.calls) == 1
    call = next(iter(running.agent.calls.values()))

    stats = await wait_for_inbound_audio(page)
    assert stats["bytesReceived"] > 4000
    await expect(page.locator("#stats dd[data-stat=codec]")).to_contain_text("opus")
    await expect(page.locator("#stats dd[data-stat=state]")).to_have_text("connected")
    await page.wait_for_function("document.getElementById('output-level').value > 0.2")
    await page.wait_for_function("document.getElementById('input-level').value > 0.2")
    await expect(page.locator("#stats dd[data-stat=round-trip]")).to_have_text(
        re.compile(r"^\d+(\.\d)? ms$"), timeout=UI_TIMEOUT_MS
    )
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "web_call_connected.png"), full_page=True)

    await expect(page.locator("#download")).to_be_hidden()
    # Record both sides as two channels, then download the WAV the page made.
    await page.select_option("#record-mode", "stereo")
    await page.click("#record")
    await expect(page.locator("#record")).to_have_attribute("aria-pressed", "true")
    await page.wait_for_timeout(2500)
    await page.click("#record")
    await expect(page.locator("#download")).to_be_visible()
    async with page.expect_download() as download_info:
        await page.click("#download")
    download = await download_info.value
    assert download.suggested_filename.endswith("-stereo.wav")
    rate, channels = wav_channels(Path(await download.path()).read_bytes())
    assert rate in (44100, 48000) and channels.shape[0] == 2
    assert channels.shape[1] > rate * 2  # about 2.5 s captured
    caller_rms, agent_rms = np.sqrt(np.mean(channels**2, axis=1))
    assert caller_rms > 0.01 and agent_rms > 0.01, (caller_rms, agent_rms)

    await page.click("#hangup")
    await expect(page.locator("#status")).to_have_text("Call ended.", timeout=UI_TIMEOUT_MS)
    await wait_until(lambda: all_freed(running), timeout=5)
    assert await active_calls(running) == 0
    assert call.end_reason == "hangup"  # the page's DELETE ended it, not a timeout
    await expect(page.locator("#call")).to_be_enabled()
    await expect(page.locator("#error")).to_be_hidden()
    assert_clean(log)


@needs_chromium
async def test_transcript_voice_choice_and_locks(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent(TextEchoPlugin(frames_per_word=2))
    page, log = await open_page(chromium, running.url + "/")
    await expect(page.locator("#voice option")).to_have_count(3, timeout=UI_TIMEOUT_MS)
    await page.select_option("#voice", "Bravo.pt")
    await page.fill("#persona", "You are a patient tester.")
    await connect(page)
    call = next(iter(running.agent.calls.values()))
    # The choice reached the plugin before the first frame (multipart offer).
    assert call.slot is not None and call.slot.config.voice == "Bravo.pt"
    assert call.slot.config.instructions == "You are a patient tester."

    await expect(page.locator("#transcript")).to_contain_text(
        "This is the test agent speaking.", timeout=UI_TIMEOUT_MS
    )
    await expect(page.locator("#transcript")).to_contain_text("Hello there.")
    await expect(page.locator("#stats dd[data-stat=state]")).to_have_text("connected")
    await page.wait_for_timeout(1200)  # one more stats poll, so the panel shows live numbers
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "web_call_transcript.png"), full_page=True)
    # voice_update is false for this plugin; instructions_update is true.
    await expect(page.locator("#voice")).to_be_disabled()
    await expect(page.locator("#voice-note")).to_contain_text("Locked")
    await expect(page.locator("#persona")).to_be_enabled()
    await expect(page.locator("#apply-session")).to_be_visible()
    await page.fill("#persona", "You are brief.")
    await page.click("#apply-session")
    await expect(page.locator("#status")).to_contain_text("Session updated", timeout=UI_TIMEOUT_MS)
    assert call.slot.config.instructions == "You are brief."

    await page.click("#hangup")
    await wait_until(lambda: all_freed(running), timeout=5)
    await expect(page.locator("#voice")).to_be_enabled()
    assert_clean(log)


@needs_chromium
async def test_server_full_says_busy(start_agent: AgentFactory, chromium: Browser) -> None:
    running = await start_agent(settings=AgentSettings(max_calls=1))
    first, _ = await open_page(chromium, running.url + "/")
    await connect(first)
    second, _ = await open_page(chromium, running.url + "/")
    await second.click("#call")
    error = second.locator("#error")
    await expect(error).to_be_visible(timeout=UI_TIMEOUT_MS)
    await expect(error).to_have_attribute("data-code", "server_full")
    await expect(error).to_contain_text("busy")
    await expect(error).to_contain_text("Try again in 5 s")
    await expect(second.locator("#status")).to_have_text("Busy.")
    await expect(second.locator("#call")).to_be_enabled()
    assert len(running.agent.calls) == 1  # the first call is untouched
    await first.click("#hangup")
    await wait_until(lambda: all_freed(running), timeout=5)


async def token_server(agent_url: str, api_key: str) -> TestServer:
    """An app server's token endpoint: mints an ephemeral secret with its own key."""

    async def token(request: web.Request) -> web.Response:
        body = await request.json()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                agent_url + "/v1/realtime/client_secrets", json=body,
                headers={"Authorization": f"Bearer {api_key}"},
            ) as response:
                return web.json_response(await response.json(), status=response.status)

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": "Content-Type",
        })

    @web.middleware
    async def cors(request: web.Request, handler: Any) -> web.StreamResponse:
        response = await handler(request)
        response.headers["Access-Control-Allow-Origin"] = "*"
        return response

    app = web.Application(middlewares=[cors])
    app.router.add_post("/token", token)
    app.router.add_route("OPTIONS", "/token", preflight)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@needs_chromium
async def test_auth_required_then_token_url_works(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("sk-test-key",)))
    page, _ = await open_page(chromium, running.url + "/")
    await expect(page.locator("#agent-info")).to_contain_text("needs authorization",
                                                              timeout=UI_TIMEOUT_MS)
    await page.click("#call")
    error = page.locator("#error")
    await expect(error).to_have_attribute("data-code", "auth_required", timeout=UI_TIMEOUT_MS)
    await expect(error).to_contain_text("token URL")
    assert not running.agent.calls

    tokens = await token_server(running.url, "sk-test-key")
    try:
        token_url = str(tokens.make_url("/token"))
        page, log = await open_page(chromium, running.url + "/?token_url=" + token_url)
        await expect(page.locator("#agent-info")).to_have_text("Agent: echo", timeout=UI_TIMEOUT_MS)
        await connect(page)
        await wait_for_inbound_audio(page)
        call = next(iter(running.agent.calls.values()))
        await page.click("#hangup")
        await wait_until(lambda: all_freed(running), timeout=5)
        assert call.end_reason == "hangup"  # the secret may DELETE the call it created
        assert_clean(log)
    finally:
        await tokens.close()


@needs_chromium
async def test_call_ended_by_server_is_explained(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    settings = AgentSettings(call=CallSettings(max_call_seconds=1.5))
    running = await start_agent(settings=settings)
    page, _ = await open_page(chromium, running.url + "/")
    await connect(page)
    error = page.locator("#error")
    await expect(error).to_have_attribute("data-code", "ended_by_server", timeout=UI_TIMEOUT_MS)
    await expect(error).to_contain_text("limited to 1.5 s")
    await expect(page.locator("#status")).to_have_text("Call ended by the agent.")
    await expect(page.locator("#call")).to_be_enabled()
    await wait_until(lambda: all_freed(running), timeout=5)


@needs_chromium
async def test_denied_microphone_is_explained(start_agent: AgentFactory) -> None:
    running = await start_agent()
    async with launch_chromium(allow_microphone=False) as browser:
        page, _ = await open_page(browser, running.url + "/")
        await page.click("#call")
        error = page.locator("#error")
        await expect(error).to_have_attribute("data-code", "mic_permission_denied",
                                              timeout=UI_TIMEOUT_MS)
        await expect(error).to_contain_text("permission")
        await expect(page.locator("#call")).to_be_enabled()
    assert not running.agent.calls


@needs_chromium
async def test_keyboard_only_call_on_a_phone_screen(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log = await open_page(chromium, running.url + "/", viewport={"width": 390, "height": 844})
    await expect(page.locator("#agent-info")).to_have_text("Agent: echo", timeout=UI_TIMEOUT_MS)
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"page is {overflow}px wider than a phone screen"
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.id") == "call"
    await page.keyboard.press("Enter")
    await expect(page.locator("#status")).to_contain_text("Connected", timeout=UI_TIMEOUT_MS)
    # Focus moved to Hang up when the call started, so one key ends it.
    assert await page.evaluate("document.activeElement.id") == "hangup"
    await wait_for_inbound_audio(page)
    await expect(page.locator("#stats dd[data-stat=state]")).to_have_text("connected")
    await page.wait_for_timeout(1200)  # one more stats poll, so the panel shows live numbers
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "web_call_phone.png"), full_page=True)
    await page.keyboard.press("Space")
    await expect(page.locator("#status")).to_have_text("Call ended.", timeout=UI_TIMEOUT_MS)
    await wait_until(lambda: all_freed(running), timeout=5)
    assert await page.evaluate("document.activeElement.id") == "call"
    assert_clean(log)


def without_candidates(sdp: str) -> str:
    return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith("a=candidate"))


@needs_chromium
async def test_unreachable_agent_says_ice_failed(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    """Network fault injection: the offer loses its candidates on the way to the agent and
    the answer's candidates point at a closed port, so no path exists either way."""
    running = await start_agent()
    page, _ = await open_page(chromium, running.url + "/")

    async def break_paths(route: Any) -> None:
        response = await route.fetch(post_data=without_candidates(route.request.post_data))
        answer = re.sub(r"(a=candidate:\S+ \d \S+ \d+ 127\.0\.0\.1 )\d+", r"\g<1>40999",
                        await response.text())
        await route.fulfill(response=response, body=answer)

    await page.route("**/v1/realtime/calls", break_paths)
    await page.click("#call")
    error = page.locator("#error")
    # Chromium gives up on unanswered ICE checks after about 15-20 s.
    await expect(error).to_have_attribute("data-code", re.compile("ice_failed|connect_timeout"),
                                          timeout=45_000)
    await expect(error).to_contain_text("TURN")
    await expect(page.locator("#status")).to_have_text("Call failed.")
    # The page released its call resource instead of leaving it to the connect timeout.
    await wait_until(lambda: all_freed(running), timeout=5)


@needs_chromium
async def test_mic_and_processing_switch_mid_call_replace_the_sent_track(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log = await open_page(chromium, running.url + "/")
    await connect(page)
    sent_settings = """() => {
        const sender = window.voiceApp.call.pc.getSenders().find((s) => s.track);
        const s = sender.track.getSettings();
        return {id: sender.track.id, ec: s.echoCancellation, ns: s.noiseSuppression,
                agc: s.autoGainControl};
    }"""
    before = await page.evaluate(sent_settings)
    assert (before["ec"], before["ns"], before["agc"]) == (True, True, True)
    await page.uncheck("#noise-suppression")
    await expect(page.locator("#status")).to_contain_text("Microphone settings applied",
                                                          timeout=UI_TIMEOUT_MS)
    after = await page.evaluate(sent_settings)
    assert after["id"] != before["id"]
    assert (after["ec"], after["ns"], after["agc"]) == (True, False, True)
    call = next(iter(running.agent.calls.values()))
    heard_at = call.watchdog.last_inbound_at
    await wait_until(lambda: call.watchdog.last_inbound_at != heard_at, timeout=5)
    await wait_for_inbound_audio(page)

    # The microphone list is filled once permission is granted; choosing one switches to it.
    options = page.locator("#mic option")
    assert await options.count() >= 2
    other = await options.nth(1).get_attribute("value")
    await page.evaluate("document.getElementById('status').textContent = ''")
    await page.select_option("#mic", other)
    await expect(page.locator("#status")).to_contain_text("Microphone settings applied",
                                                          timeout=UI_TIMEOUT_MS)
    device = await page.evaluate("""() => window.voiceApp.call.pc.getSenders()
        .find((s) => s.track).track.getSettings().deviceId""")
    assert device == other
    heard_at = call.watchdog.last_inbound_at
    await wait_until(lambda: call.watchdog.last_inbound_at != heard_at, timeout=5)
    await page.click("#hangup")
    await wait_until(lambda: all_freed(running), timeout=5)
    assert_clean(log)


@needs_chromium
async def test_hang_up_while_connecting_leaves_nothing_behind(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    created: list[Any] = []
    create_call = running.agent.create_call

    async def recording_create_call(*args: Any, **kwargs: Any) -> Any:
        call, answer = await create_call(*args, **kwargs)
        created.append(call)
        return call, answer

    running.agent.create_call = recording_create_call  # type: ignore[method-assign]
    page, log = await open_page(chromium, running.url + "/")
    offer_posted = asyncio.Event()
    release_offer = asyncio.Event()

    async def hold_offer(route: Any) -> None:
        offer_posted.set()
        await release_offer.wait()
        await route.continue_()

    await page.route("**/v1/realtime/calls", hold_offer)
    await page.click("#call")
    await asyncio.wait_for(offer_posted.wait(), timeout=15)
    await page.click("#hangup")
    await expect(page.locator("#status")).to_have_text("Call ended.", timeout=UI_TIMEOUT_MS)
    release_offer.set()  # the agent now answers a call nobody wants
    await wait_until(lambda: len(created) == 1, timeout=10)
    await wait_until(lambda: all_freed(running), timeout=10)
    assert created[0].end_reason == "hangup"  # the page DELETEd it as soon as the answer came
    assert await page.evaluate("window.voiceApp.call === null")
    await expect(page.locator("#call")).to_be_enabled()
    await expect(page.locator("#error")).to_be_hidden()
    assert_clean(log)
