"""Malformed input never gets a 5xx: content types, absurdly deep JSON, SDP directions."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from agent.errors import AgentError
from agent.realtime import client_json
from agent.realtime.events import parse_client_event
from agent.telephony.media_stream import ProtocolError, parse_message
from agent.webrtc.sdp import with_explicit_directions
from tests.support.agents import RunningAgent, all_freed, wait_until

JSON_ROUTES = ["/offer", "/v1/telephony/rtp", "/v1/realtime/client_secrets"]
DEEP = "[" * 60_000 + "]" * 60_000  # 120 KB: inside the body limit


@pytest.mark.parametrize("path", JSON_ROUTES)
async def test_json_routes_take_only_application_json(echo_agent: RunningAgent,
                                                      path: str) -> None:
    # text/plain and forms are what a foreign page can send without a CORS preflight.
    simple = [
        {"data": "{}", "headers": {"Content-Type": "text/plain"}},
        {"data": "{}"},  # aiohttp labels a str body text/plain
        {"data": {"remote": "127.0.0.1:9"}},  # application/x-www-form-urlencoded
        {"data": aiohttp.FormData({"a": "{}"}, default_to_multipart=True)},
    ]
    async with aiohttp.ClientSession() as http:
        for kwargs in simple:
            async with http.post(echo_agent.url + path, **kwargs) as response:
                body = await response.json()
                assert response.status == 415, (kwargs, body)
                assert body["error"]["code"] == "unsupported_media_type"
    assert not echo_agent.agent.telephony_legs and all_freed(echo_agent)


@pytest.mark.parametrize("path", JSON_ROUTES)
async def test_absurdly_deep_json_is_a_400(echo_agent: RunningAgent, path: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    body = '{"type": "offer", "sdp": "v=0", "session": ' + DEEP + "}"
    caplog.set_level(logging.ERROR)
    async with aiohttp.ClientSession() as http:
        async with http.post(echo_agent.url + path, data=body,
                             headers={"Content-Type": "application/json"}) as response:
            answer = await response.json()
            assert (response.status, answer["error"]["code"]) == (400, "invalid_json")
        # Deep but decodable by json: still refused by the nesting limit.
        shallow_enough = "[" * 500 + "]" * 500
        async with http.post(echo_agent.url + path, data='{"session": ' + shallow_enough + "}",
                             headers={"Content-Type": "application/json"}) as response:
            assert (response.status, (await response.json())["error"]["code"]) == (
                400, "invalid_json")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_deep_multipart_session_is_a_400(echo_agent: RunningAgent) -> None:
    form = aiohttp.FormData(default_to_multipart=True)
    form.add_field("sdp", "v=0\r\n")
    form.add_field("session", "[" * 30_000 + "]" * 30_000)  # the session field holds 64 KiB
    async with aiohttp.ClientSession() as http:
        async with http.post(echo_agent.url + "/v1/realtime/calls", data=form) as response:
            answer = await response.json()
    assert (response.status, answer["error"]["code"]) == (400, "invalid_json")


def test_deep_events_are_coded_errors_not_tracebacks() -> None:
    with pytest.raises(AgentError) as caught:
        parse_client_event('{"type": "x", "a": ' + "[" * 30_000 + "]" * 30_000 + "}")
    assert caught.value.code == "invalid_json"
    with pytest.raises(ProtocolError) as stream_error:
        parse_message('{"event": "media", "media": ' + "[" * 4_000 + "]" * 4_000 + "}")
    assert stream_error.value.code == "invalid_json"
    assert client_json.loads('{"a": [[1]]}') == {"a": [[1]]}
    assert not client_json.depth_exceeds([[[]]], 3) and client_json.depth_exceeds([[[[]]]], 3)
    with pytest.raises(client_json.ClientJsonError):
        client_json.loads(b"\xff")


def test_sections_without_a_direction_get_the_default() -> None:
    sdp = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
           "m=audio 9 RTP/AVP 0\r\na=mid:0\r\n"
           "m=audio 9 RTP/AVP 0\r\na=mid:1\r\na=recvonly\r\n"
           "m=audio 9 RTP/AVP 0\r\na=mid:2\r\na=direction:bogus\r\n")
    fixed = with_explicit_directions(sdp)
    sections = fixed.split("m=")[1:]
    assert ["a=sendrecv" in s for s in sections] == [True, False, True]
    assert "a=recvonly" in sections[1] and fixed.endswith("\r\n")
    session_level = sdp.replace("t=0 0\r\n", "t=0 0\r\na=sendonly\r\n")
    assert with_explicit_directions(session_level).split("m=")[1].count("a=sendonly") == 1
    assert with_explicit_directions(fixed) == fixed


@pytest.mark.parametrize("replacement", ["", "a=direction:bogus\r\n", "a=sendrecv:x\r\n"])
async def test_offers_without_a_usable_direction_still_connect(
    echo_agent: RunningAgent, replacement: str
) -> None:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    offer = pc.localDescription.sdp.replace("a=sendrecv\r\n", replacement)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(echo_agent.url + "/v1/realtime/calls", data=offer,
                                 headers={"Content-Type": "application/sdp"}) as response:
                answer = await response.text()
                assert response.status == 201, answer
                location = response.headers["Location"]
            assert "a=sendrecv" in answer
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
            async with http.delete(echo_agent.url + location) as response:
                assert response.status == 200
    finally:
        await pc.close()
    await wait_until(lambda: all_freed(echo_agent))


def test_client_json_error_message_is_json_safe() -> None:
    with pytest.raises(client_json.ClientJsonError) as caught:
        client_json.loads("{")
    json.dumps({"message": str(caught.value)})
