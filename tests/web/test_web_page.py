"""The browser page in real headless Chromium against a real agent on 127.0.0.1.

Chromium's fake microphone plays tests/fixtures/speech_16k.wav; the agent's ICE host
candidates are limited to 127.0.0.1 (tests/support/agents.py) and Chromium reaches them from
its own host candidates (peer-reflexive on the agent's side).
"""

from __future__ import annotations

import asyncio
import io
import re
import shutil
import subprocess
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, Request, expect

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling import drain
from signaling import page as page_module
from signaling.__main__ import build_parser
from signaling.app import create_app
from signaling.auth import AuthSettings
from tests.support import SPEECH_WAV
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.chromium import PageLog, chromium_path, launch_chromium, open_page
from tests.support.text_echo_plugin import TextEchoPlugin

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
UI_TIMEOUT_MS = 15_000

chromium_missing = pytest.mark.skipif(chromium_path() is None,
                                      reason="Chromium is not installed (apt install chromium)")


def needs_chromium(test: Any) -> Any:
    """A test in headless Chromium: marked `browser`, skipped where Chromium is missing."""
    return pytest.mark.browser(chromium_missing(test))


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    async with launch_chromium(SPEECH_WAV) as browser:
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


# On a keyed agent the page's keyless GET /v1/models on load gets 401 (it asks the token URL
# nothing until the user acts), and Chromium logs every failed fetch as a console error.
UNAUTHORIZED_ON_LOAD = "status of 401 (Unauthorized)"


def assert_clean(log: PageLog, *, allowed: tuple[str, ...] = ()) -> None:
    assert log.page_errors == [], log.page_errors
    unexpected = [e for e in log.console_errors if not any(a in e for a in allowed)]
    assert unexpected == [], unexpected


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
@pytest.mark.slow
async def test_call_plays_agent_audio_records_and_hangs_up(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log = await open_page(chromium, running.url + "/")
    await connect(page)
    assert len(running.agent.webrtc_legs) == 1
    call = next(iter(running.agent.webrtc_legs.values()))

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
    call = next(iter(running.agent.webrtc_legs.values()))
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
    assert len(running.agent.webrtc_legs) == 1  # the first call is untouched
    await first.click("#hangup")
    await wait_until(lambda: all_freed(running), timeout=5)


@dataclass
class TokenServer:
    """An app server's token endpoint on its own loopback origin: mints an ephemeral secret
    at the agent with its own key, and remembers every request that reached it."""

    server: TestServer
    requests: list[str] = field(default_factory=list)  # "METHOD /path"
    agent_url: str = ""
    api_key: str = "sk-test-key"

    @property
    def origin(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/token"))

    def posts(self) -> int:
        return sum(1 for line in self.requests if line.startswith("POST "))


async def token_server() -> TokenServer:
    """Started before the agent (whose --token-url-origin names it); set `agent_url` after."""
    tokens: TokenServer

    async def token(request: web.Request) -> web.Response:
        body = await request.json()
        async with aiohttp.ClientSession() as http:
            async with http.post(
                tokens.agent_url + "/v1/realtime/client_secrets", json=body,
                headers={"Authorization": f"Bearer {tokens.api_key}"},
            ) as response:
                return web.json_response(await response.json(), status=response.status)

    async def preflight(request: web.Request) -> web.Response:
        return web.Response(status=204, headers={
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": "Content-Type",
        })

    @web.middleware
    async def cors(request: web.Request, handler: Any) -> web.StreamResponse:
        tokens.requests.append(f"{request.method} {request.path}")
        response = await handler(request)
        response.headers["Access-Control-Allow-Origin"] = "*"
        return response

    app = web.Application(middlewares=[cors])
    app.router.add_post("/token", token)
    app.router.add_route("OPTIONS", "/token", preflight)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    tokens = TokenServer(server)
    return tokens


async def open_recorded_page(browser: Browser, url: str) -> tuple[Page, PageLog, list[Request]]:
    """open_page, with every request the page makes recorded from before it loads."""
    context = await browser.new_context(viewport={"width": 1100, "height": 900})
    page = await context.new_page()
    log = PageLog()
    requests: list[Request] = []
    page.on("console", log.on_console)
    page.on("pageerror", log.on_page_error)
    page.on("request", lambda request: requests.append(request))
    await page.goto(url)
    return page, log, requests


def paths(requests: list[Request], method: str | None = None) -> list[str]:
    return [urlsplit(r.url).path for r in requests if method is None or r.method == method]


async def ready_status(running: RunningAgent) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/health/ready") as response:
            return response.status


@needs_chromium
async def test_auth_required_then_token_url_works(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    tokens = await token_server()
    try:
        running = await start_agent(auth=AuthSettings(api_keys=(tokens.api_key,)),
                                    token_url_origins=(tokens.origin,))
        tokens.agent_url = running.url
        page, _ = await open_page(chromium, running.url + "/")
        await expect(page.locator("#agent-info")).to_contain_text("needs authorization",
                                                                  timeout=UI_TIMEOUT_MS)
        await page.click("#call")
        error = page.locator("#error")
        await expect(error).to_have_attribute("data-code", "auth_required", timeout=UI_TIMEOUT_MS)
        await expect(error).to_contain_text("token URL")
        assert not running.agent.webrtc_legs

        page, log = await open_page(chromium, running.url + "/?token_url=" + quote(tokens.url))
        await expect(page.locator("#agent-info")).to_contain_text(
            "the token URL will be used when you press Call", timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#token-origins")).to_contain_text(tokens.origin)
        await expect(page.locator("#error")).to_be_hidden()
        await page.wait_for_load_state("networkidle")
        assert tokens.requests == []  # loading the page asks the token URL nothing
        await connect(page)
        assert tokens.posts() == 1
        # The first secret let the page list the agent (and its voices, for the next call).
        await expect(page.locator("#agent-info")).to_have_text("Agent: echo")
        await wait_for_inbound_audio(page)
        call = next(iter(running.agent.webrtc_legs.values()))
        await page.click("#hangup")
        await wait_until(lambda: all_freed(running), timeout=5)
        assert call.end_reason == "hangup"  # the secret may DELETE the call it created
        assert_clean(log, allowed=(UNAUTHORIZED_ON_LOAD,))
    finally:
        await tokens.server.close()


@needs_chromium
async def test_load_voices_is_a_user_action(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    tokens = await token_server()
    try:
        running = await start_agent(TextEchoPlugin(frames_per_word=2),
                                    auth=AuthSettings(api_keys=(tokens.api_key,)),
                                    token_url_origins=(tokens.origin,))
        tokens.agent_url = running.url
        page, log = await open_page(chromium, running.url + "/?token_url=" + quote(tokens.url))
        load = page.locator("#load-voices")
        await expect(load).to_be_visible(timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#voice option")).to_have_count(1)
        # Typing another accepted token URL asks nothing either.
        await page.fill("#token-url", tokens.url + "?again=1")
        await page.dispatch_event("#token-url", "change")
        await page.wait_for_load_state("networkidle")
        assert tokens.requests == []
        await load.click()
        await expect(page.locator("#voice option")).to_have_count(3, timeout=UI_TIMEOUT_MS)
        assert tokens.posts() == 1
        await expect(load).to_be_hidden()
        assert not running.agent.webrtc_legs
        assert_clean(log, allowed=(UNAUTHORIZED_ON_LOAD,))
    finally:
        await tokens.server.close()


@needs_chromium
async def test_token_url_on_an_origin_not_allowed_gets_no_request(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    tokens = await token_server()
    try:
        running = await start_agent(auth=AuthSettings(api_keys=(tokens.api_key,)),
                                    token_url_origins=("https://app.example",))
        tokens.agent_url = running.url
        page, log = await open_page(chromium, running.url + "/?token_url=" + quote(tokens.url))
        error = page.locator("#error")
        await expect(error).to_have_attribute("data-code", "token_url_refused",
                                              timeout=UI_TIMEOUT_MS)
        await expect(error).to_contain_text(f"{tokens.origin} is not among the origins")
        await expect(error).to_contain_text("--token-url-origin")
        await expect(page.locator("#agent-info")).to_contain_text("token URL set was refused",
                                                                  timeout=UI_TIMEOUT_MS)
        await expect(page.locator("#load-voices")).to_be_hidden()
        await page.click("#call")
        await expect(page.locator("#status")).to_have_text("Call not started.")
        await expect(error).to_have_attribute("data-code", "token_url_refused")
        await expect(page.locator("#call")).to_be_enabled()
        await page.wait_for_load_state("networkidle")
        assert tokens.requests == []
        assert not running.agent.webrtc_legs
        assert_clean(log, allowed=(UNAUTHORIZED_ON_LOAD,))
    finally:
        await tokens.server.close()


@needs_chromium
async def test_a_link_to_admin_drain_sends_nothing_and_the_server_keeps_serving(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    """The reported hole: `/?token_url=/admin/drain` drained an open server on page load."""
    running = await start_agent()
    page, log, requests = await open_recorded_page(
        chromium, running.url + "/?token_url=/admin/drain")
    await page.wait_for_load_state("networkidle")
    assert "/admin/drain" not in paths(requests)
    assert not running.server.app[drain.DRAIN_KEY].draining
    assert paths(requests, "POST") == []  # nothing but GETs on load
    error = page.locator("#error")
    await expect(error).to_have_attribute("data-code", "token_url_refused", timeout=UI_TIMEOUT_MS)
    await expect(error).to_contain_text(
        "only /v1/realtime/client_secrets may be used, not /admin/drain")
    await expect(error).to_contain_text("--token-url-origin")
    await expect(page.locator("#agent-info")).to_have_text("Agent: echo")

    # Nor does pressing Call, or typing another route of the agent into the field.
    await page.click("#call")
    await expect(page.locator("#status")).to_have_text("Call not started.")
    await page.fill("#token-url", "/v1/realtime/calls")
    await page.dispatch_event("#token-url", "change")
    await expect(error).to_contain_text("not /v1/realtime/calls")
    await page.click("#call")
    await expect(error).to_have_attribute("data-code", "token_url_refused")
    await page.wait_for_load_state("networkidle")
    assert "/admin/drain" not in paths(requests)
    assert paths(requests, "POST") == []
    assert not running.server.app[drain.DRAIN_KEY].draining
    assert await ready_status(running) == 200
    assert not running.agent.webrtc_legs
    assert_clean(log)


@needs_chromium
async def test_same_origin_client_secrets_route_on_an_open_server(
    start_agent: AgentFactory, chromium: Browser
) -> None:
    running = await start_agent()
    page, log, requests = await open_recorded_page(
        chromium, running.url + "/?token_url=/v1/realtime/client_secrets")
    await expect(page.locator("#agent-info")).to_have_text("Agent: echo", timeout=UI_TIMEOUT_MS)
    await page.wait_for_load_state("networkidle")
    assert paths(requests, "POST") == []
    await expect(page.locator("#error")).to_be_hidden()
    await connect(page)
    await wait_for_inbound_audio(page)
    assert paths(requests, "POST") == ["/v1/realtime/client_secrets", "/v1/realtime/calls"]
    offer = next(r for r in requests if r.method == "POST" and r.url.endswith("/calls"))
    assert (await offer.all_headers())["authorization"].startswith("Bearer ek_")
    call = next(iter(running.agent.webrtc_legs.values()))
    await page.click("#hangup")
    await wait_until(lambda: all_freed(running), timeout=5)
    assert call.end_reason == "hangup"
    assert_clean(log)


def test_token_url_origin_flag_normalizes_and_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args([
        "--token-url-origin", "HTTPS://App.Example:443/", "--token-url-origin",
        "http://localhost:8000", "--token-url-origin", "http://[0::1]:9", "--token-url-origin",
        "https://app.example"])
    assert page_module.origins_from_args(args) == (
        "https://app.example", "http://localhost:8000", "http://[::1]:9")
    assert page_module.origins_from_args(build_parser().parse_args([])) == ()
    for bad, says in [("http://app.example", "http is accepted only on loopback"),
                      ("https://app.example/token", "no path"),
                      ("*", "give an origin"), ("javascript:alert(1)", "give an origin")]:
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["--token-url-origin", bad])
        assert exited.value.code == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"error [token_url_origin_invalid]: --token-url-origin {bad!r}")
        assert says in lines[0]


async def test_index_carries_the_allowed_origins(start_agent: AgentFactory) -> None:
    running = await start_agent(token_url_origins=("https://app.example", "http://127.0.0.1:9"))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/") as response:
            assert response.status == 200
            assert response.content_type == "text/html"
            text = await response.text()
    assert ('<meta name="token-url-origins" content="https://app.example http://127.0.0.1:9">'
            in text)
    assert page_module.render(page_module.META_PLACEHOLDER, ['"><script>']) == (
        '<meta name="token-url-origins" content="&quot;&gt;&lt;script&gt;">')
    with pytest.raises(ValueError, match="--token-url-origin 'http://evil.example'"):
        create_app(MediaAgent(EchoPlugin(), AgentSettings()),
                   token_url_origins=("http://evil.example",))


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
    async with launch_chromium(SPEECH_WAV, allow_microphone=False) as browser:
        page, _ = await open_page(browser, running.url + "/")
        await page.click("#call")
        error = page.locator("#error")
        await expect(error).to_have_attribute("data-code", "mic_permission_denied",
                                              timeout=UI_TIMEOUT_MS)
        await expect(error).to_contain_text("permission")
        await expect(page.locator("#call")).to_be_enabled()
    assert not running.agent.webrtc_legs


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
@pytest.mark.slow
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
    call = next(iter(running.agent.webrtc_legs.values()))
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
