"""`POST /offer`: every bad request gets its 4xx and code; good calls still work after."""

from __future__ import annotations

import aiohttp
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from agent.testing.peer import SignalTrack, run_call
from agent.testing.testsignal import make_test_signal
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until

AUDIO_OFFER_HEAD = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
VIDEO_ONLY = (AUDIO_OFFER_HEAD + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\n"
              "a=rtpmap:96 VP8/90000\r\n")
GARBLED_AUDIO = AUDIO_OFFER_HEAD + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nthis is not sdp\r\n"
NO_COMMON_CODEC = (
    AUDIO_OFFER_HEAD
    + "m=audio 9 UDP/TLS/RTP/SAVPF 100\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtcp-mux\r\na=rtpmap:100 SILK/16000\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AA"] * 32) + "\r\na=setup:actpass\r\n"
)

BAD_REQUESTS = [
    ("not json", "{nope", 400, "invalid_json"),
    ("json array", "[1, 2]", 400, "invalid_json"),
    ("missing type", {"sdp": "v=0"}, 400, "invalid_type"),
    ("answer type", {"sdp": "v=0", "type": "answer"}, 400, "invalid_type"),
    ("missing sdp", {"type": "offer"}, 400, "missing_sdp"),
    ("sdp not a string", {"type": "offer", "sdp": 42}, 400, "invalid_sdp"),
    ("empty sdp", {"type": "offer", "sdp": "  "}, 400, "invalid_sdp"),
    ("not sdp", {"type": "offer", "sdp": "hello"}, 400, "invalid_sdp"),
    ("video only", {"type": "offer", "sdp": VIDEO_ONLY}, 400, "no_audio"),
    ("garbled audio", {"type": "offer", "sdp": GARBLED_AUDIO}, 400, "invalid_sdp"),
    ("no common codec", {"type": "offer", "sdp": NO_COMMON_CODEC}, 400, "no_common_codec"),
    ("session not object", {"type": "offer", "sdp": "v=0\r\nm=audio", "session": 3}, 400,
     "invalid_session"),
    ("voice not string", {"type": "offer", "sdp": "v=0\r\nm=audio", "session": {"voice": 1}},
     400, "invalid_session"),
    ("unknown plugin option",
     {"type": "offer", "sdp": "v=0\r\nm=audio", "session": {"extra_body": {"nope": 1}}},
     400, "unknown_option"),
    ("bad echo delay",
     {"type": "offer", "sdp": "v=0\r\nm=audio", "session": {"extra_body": {"delay_frames": -1}}},
     400, "invalid_option"),
    ("huge body", {"type": "offer", "sdp": "v=0\r\n" + "a=x\r\n" * 100_000}, 413,
     "body_too_large"),
]


async def post(url: str, body: object) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http:
        kwargs: dict = ({"data": body, "headers": {"Content-Type": "application/json"}}
                        if isinstance(body, str) else {"json": body})
        async with http.post(url + "/offer", **kwargs) as response:
            return response.status, await response.json(content_type=None)


@pytest.mark.parametrize(("name", "body", "status", "code"), BAD_REQUESTS,
                         ids=[r[0] for r in BAD_REQUESTS])
async def test_bad_offer_gets_a_coded_4xx(
    echo_agent: RunningAgent, name: str, body: object, status: int, code: str
) -> None:
    got_status, payload = await post(echo_agent.url, body)
    assert got_status == status, payload
    assert payload["error"]["code"] == code
    assert payload["error"]["message"]
    assert all_freed(echo_agent)


async def test_server_serves_a_good_call_after_bad_requests(echo_agent: RunningAgent) -> None:
    for _, body, _, _ in BAD_REQUESTS * 3:
        await post(echo_agent.url, body)
    async with aiohttp.ClientSession() as http:
        async with http.get(echo_agent.url + "/nowhere") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"
        async with http.get(echo_agent.url + "/offer") as response:
            assert response.status == 405
            assert (await response.json())["error"]["code"] == "method_not_allowed"
    report, _, _ = await run_call(echo_agent.url, seconds=2.0)
    assert report.ok and report.correlation is not None and report.correlation >= 0.8
    await wait_until(lambda: all_freed(echo_agent))


async def test_health_counts_active_calls(echo_agent: RunningAgent) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(echo_agent.url + "/health") as response:
            health = await response.json()
    assert health["status"] == "ok" and health["active_calls"] == 0
    assert health["plugin"] == "echo"


async def test_an_offer_call_is_a_resource_its_owner_can_hang_up(start_agent: AgentFactory) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=("key-a", "key-b")))
    caller = RTCPeerConnection()
    caller.addTrack(SignalTrack(make_test_signal(5.0)))
    try:
        await caller.setLocalDescription(await caller.createOffer())
        async with aiohttp.ClientSession() as http:
            owner = {"Authorization": "Bearer key-a"}
            async with http.post(running.url + "/offer", headers=owner, json={
                    "sdp": caller.localDescription.sdp, "type": "offer"}) as response:
                answer = await response.json()
                assert response.status == 200, answer
            call_id = answer["call_id"]
            assert answer["location"] == f"/v1/realtime/calls/{call_id}"
            await caller.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
            url = running.url + answer["location"]
            async with http.delete(url, headers={"Authorization": "Bearer key-b"}) as response:
                assert response.status == 404  # another credential does not see it
            async with http.delete(url, headers=owner) as response:
                assert response.status == 200 and (await response.json())["status"] == "ended"
        await wait_until(lambda: all_freed(running))
    finally:
        await caller.close()
