"""A media-stream key in a percent-encoded spelling of the path is refused, and logged
nowhere in clear; the canonical spellings still authenticate."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import aiohttp
import pytest
from yarl import URL

from agent.logs.redact import RedactingFilter
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, wait_until

from .test_media_stream import PATH, Bridge

KEY = "sk-percent-encoded-7"
ENCODED_ROUTES = ("/v1/telephony/media%2Dstream", "/v1/telephony/media%2dstream",
                  "/v1/telephony/%6D%65dia-stream", "/v1/telephony%2Fmedia-stream")
UPGRADE = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "MDEyMzQ1Njc4OWFiY2RlZg=="}


@pytest.fixture
def redacted_caplog(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog with the filter the server CLI puts on its log handlers."""
    caplog.set_level(logging.DEBUG)
    log_filter = RedactingFilter([PATH])
    caplog.handler.addFilter(log_filter)
    yield caplog
    caplog.handler.removeFilter(log_filter)


async def test_percent_encoded_path_is_refused_and_its_key_never_logged(
    start_agent: AgentFactory, redacted_caplog: pytest.LogCaptureFixture,
) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(KEY,)))
    async with aiohttp.ClientSession() as http:
        for route in ENCODED_ROUTES:
            for query in ("", f"?token={KEY}"):
                url = URL(f"{running.url}{route}/{KEY}{query}", encoded=True)
                async with http.get(url, headers=UPGRADE) as response:
                    assert response.status in (400, 404), route  # never 101
                    if route != "/v1/telephony%2Fmedia-stream":  # %2F: no route matches
                        assert response.status == 400
                        body = await response.json()
                        assert body["error"]["code"] == "non_canonical_path"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(URL(f"{running.url}{ENCODED_ROUTES[0]}/{KEY}", encoded=True))
        assert refused.value.status == 400
    assert not running.agent.telephony_legs

    def access_lines() -> list[str]:
        return [r.getMessage() for r in redacted_caplog.records if r.name == "aiohttp.access"]

    await wait_until(lambda: len(access_lines()) >= 2 * len(ENCODED_ROUTES) + 1)
    assert all(f"{PATH}/***" in line for line in access_lines()), access_lines()
    leaked = [r.getMessage() for r in redacted_caplog.records if KEY in r.getMessage()]
    assert leaked == []


async def test_canonical_spellings_still_authenticate(
    start_agent: AgentFactory, redacted_caplog: pytest.LogCaptureFixture,
) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(KEY,)))
    encoded_key = "".join(f"%{byte:02X}" for byte in KEY.encode())  # the token may be
    async with aiohttp.ClientSession() as http:
        for path in (f"{PATH}/{KEY}", f"{PATH}?token={KEY}", f"{PATH}/{encoded_key}"):
            bridge = Bridge(await http.ws_connect(URL(running.url + path, encoded=True)))
            bridge.start_reading()
            await bridge.open()
            await wait_until(lambda: any(s.slot for s in running.agent.telephony_legs.values()))
            await bridge.socket.close()
            await wait_until(lambda: not running.agent.telephony_legs)
    assert not [r for r in redacted_caplog.records if KEY in r.getMessage()]
