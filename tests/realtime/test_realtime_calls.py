"""The OpenAI-Realtime / WHIP-style call flow with a real aiortc client over loopback."""

from __future__ import annotations

import asyncio

import aiohttp

from agent.testing.peer import PEER_RATE
from agent.testing.testsignal import measure_echo
from tests.support.agents import AgentFactory, all_freed, wait_until
from tests.support.realtime import CALLS, RealtimeClient


async def test_sdp_call_full_flow(start_agent: AgentFactory,
                                  realtime_clients: list[RealtimeClient]) -> None:
    running = await start_agent()
    client = RealtimeClient(running.url, seconds=30)
    realtime_clients.append(client)
    await client.call()

    headers = client.response_headers
    assert headers["Content-Type"].startswith("application/sdp")
    assert client.location == f"{CALLS}/{client.call_id}"
    assert client.call_id.startswith("call_") and len(client.call_id) >= 25
    assert client.etag and client.etag.startswith('"')
    assert client.call_id in running.agent.webrtc_legs

    created = await client.wait_event("session.created")
    assert created["session"]["id"] == client.call_id
    assert created["session"]["plugin"] == "echo"
    assert created["session"]["capabilities"]["sample_rate"] == 24000

    mark = await client.send_event({"type": "session.update", "event_id": "evt_1",
                                    "session": {"instructions": "be brief",
                                                "audio": {"output": {"voice": "alloy"}}}})
    updated = await client.wait_event("session.updated", after=mark)
    assert updated["session"]["instructions"] == "be brief"
    assert updated["session"]["voice"] == "alloy"
    assert updated["session"]["audio"]["output"]["voice"] == "alloy"
    assert updated["session"]["type"] == "realtime"

    await client.wait_audio(2.5)
    sent = client.signal[: client.source.position]
    echo = measure_echo(sent, client.recording.samples(), PEER_RATE)
    assert echo.correlation > 0.5, echo

    # The echo of the caller's signal is agent speech: it starts, and a barge-in clears it.
    await client.wait_event("output_audio_buffer.started")
    for barge_in in ("response.cancel", "output_audio_buffer.clear"):
        mark = await client.send_event({"type": barge_in, "event_id": f"evt_{barge_in}"})
        cleared = await client.wait_event("output_audio_buffer.cleared", after=mark)
        assert isinstance(cleared["dropped_ms"], int) and cleared["dropped_ms"] >= 0
        assert client.call_id in running.agent.webrtc_legs
    # The call goes on in the new epoch: audio keeps arriving without renegotiation.
    heard = client.received_seconds
    await client.wait_audio(heard + 0.5)

    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + client.location) as response:
            assert response.status == 200
            assert response.headers["ETag"] == client.etag
            resource = await response.json()
        assert (resource["id"], resource["status"]) == (client.call_id, "active")
        assert resource["session"]["instructions"] == "be brief"
        assert resource["stats"]["connection_state"] == "connected"
        assert resource["stats"]["inbound"]["frames_stepped"] > 0
        async with http.delete(running.url + client.location) as response:
            assert response.status == 200
            assert (await response.json())["id"] == client.call_id
        async with http.get(running.url + client.location) as response:
            assert response.status == 404
        async with http.delete(running.url + client.location) as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "call_not_found"
    assert client.call_id not in running.agent.webrtc_legs
    await wait_until(lambda: all_freed(running))


async def test_multipart_offer_applies_session_before_first_frame(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    running = await start_agent()
    client = RealtimeClient(running.url)
    realtime_clients.append(client)
    await client.call({"type": "realtime", "instructions": "you are a parrot",
                       "audio": {"output": {"voice": "verse"}},
                       "extra_body": {"delay_frames": 5}}, multipart=True)
    created = await client.wait_event("session.created")
    assert created["session"]["instructions"] == "you are a parrot"
    assert created["session"]["voice"] == "verse"
    call = running.agent.webrtc_legs[client.call_id]
    assert call.slot is not None and call.slot.config.options["delay_frames"] == 5

    await client.wait_audio(2.0)
    sent = client.signal[: client.source.position]
    echo = measure_echo(sent, client.recording.samples(), PEER_RATE)
    # 5 frames of 80 ms delay line on top of the transport: the echo comes back > 400 ms late.
    assert echo.correlation > 0.5
    assert echo.lag_seconds + (client.recording.first_at - client.source.started_at) > 0.4

    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + client.location + "/hangup") as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))


async def test_multipart_refused_session_is_a_coded_400(start_agent: AgentFactory) -> None:
    running = await start_agent()
    client = RealtimeClient(running.url)
    try:
        sdp = await client.offer_sdp()
        async with aiohttp.ClientSession() as http:
            response = await client.post(http, sdp, {"extra_body": {"delay_frames": "x"}})
            async with response:
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["code"] == "invalid_option"
                assert error["param"] == "extra_body.delay_frames"
    finally:
        await client.close()
    assert all_freed(running)


def remote_host_ports(pc: object) -> set[int]:
    """Ports of the host candidates the agent's ICE transport knows for its caller."""
    ports = set()
    for transceiver in pc.getTransceivers():  # type: ignore[attr-defined]
        for candidate in transceiver.receiver.transport.transport.getRemoteCandidates():
            if candidate.type == "host":
                ports.add(candidate.port)
    return ports


async def test_trickled_candidates_reach_the_agent(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    from aiortc import RTCSessionDescription

    from tests.support.realtime import ice_credentials, sdpfrag, strip_candidates

    running = await start_agent()
    client = RealtimeClient(running.url)
    realtime_clients.append(client)
    # The offer carries no candidates at all; they follow in a PATCH.
    sdp, candidates = strip_candidates(await client.offer_sdp())
    assert candidates
    async with aiohttp.ClientSession() as http:
        async with await client.post(http, sdp) as response:
            assert response.status == 201
            answer, location = await response.text(), response.headers["Location"]
            etag = response.headers["ETag"]
        call = running.agent.webrtc_legs[location.rsplit("/", 1)[-1]]
        assert remote_host_ports(call.pc) == set()
        ufrag, pwd = ice_credentials(sdp)
        async with http.patch(running.url + location, data=sdpfrag(ufrag, pwd, candidates),
                              headers={"Content-Type": "application/trickle-ice-sdpfrag",
                                       "If-Match": etag}) as response:
            assert response.status == 204
            assert response.headers["ETag"] == etag
        # The agent now knows exactly the caller's candidates (before any check could have
        # taught it a peer-reflexive one: the caller has not even seen the answer yet).
        # With BUNDLE the agent runs one transport, that of the first media section.
        first_mid = candidates[0][0]
        offered_ports = {int(line.split()[5]) for mid, line in candidates if mid == first_mid}
        assert remote_host_ports(call.pc) == offered_ports
        await client.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        await asyncio.wait_for(client.connected.wait(), 15)
        client.location = location
        await client.wait_audio(1.0)
        async with http.delete(running.url + location) as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))


async def test_config_advertises_ice_servers(start_agent: AgentFactory) -> None:
    from aiortc import RTCIceServer

    from agent.media_agent import AgentSettings

    servers = [RTCIceServer(urls="stun:127.0.0.1:9"),
               RTCIceServer(urls=["turn:127.0.0.1:9?transport=udp"], username="u",
                            credential="p")]
    running = await start_agent(settings=AgentSettings(ice_servers=servers))
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/v1/realtime/config") as response:
            assert response.status == 200
            config = await response.json()
    assert config["ice_servers"] == [
        {"urls": ["stun:127.0.0.1:9"]},
        {"urls": ["turn:127.0.0.1:9?transport=udp"], "username": "u", "credential": "p"},
    ]
    assert config["calls_url"] == CALLS
    assert config["data_channel"] == "oai-events"


async def test_models_list_names_the_plugin(start_agent: AgentFactory) -> None:
    running = await start_agent()
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/v1/models") as response:
            body = await response.json()
        async with http.get(running.url + "/v1/models/echo") as response:
            assert response.status == 200
        async with http.get(running.url + "/v1/models/gpt-4o") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "model_not_found"
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["echo"]
    assert body["data"][0]["object"] == "model"
    assert body["data"][0]["voices"] == []


async def test_options_preflight_and_cors_headers(start_agent: AgentFactory) -> None:
    running = await start_agent(cors_origins=("*",))
    async with aiohttp.ClientSession() as http:
        async with http.options(running.url + CALLS, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
        }) as response:
            assert response.status == 204
            assert response.headers["Accept-Post"].startswith("application/sdp")
            assert "POST" in response.headers["Access-Control-Allow-Methods"]
            assert "Authorization" in response.headers["Access-Control-Allow-Headers"]
            assert response.headers["Access-Control-Allow-Origin"] == "*"
            exposed = response.headers["Access-Control-Expose-Headers"]
            assert all(h in exposed for h in ("Location", "ETag", "Link"))
        async with http.options(running.url + CALLS + "/call_x") as response:
            assert response.status == 204
            assert "PATCH" in response.headers["Access-Control-Allow-Methods"]
            assert "DELETE" in response.headers["Access-Control-Allow-Methods"]
        async with http.options(running.url + "/nowhere") as response:
            assert response.status == 404
        async with http.post(running.url + CALLS, data="x",
                             headers={"Content-Type": "text/plain"}) as response:
            assert response.status == 415
            assert response.headers["Access-Control-Allow-Origin"] == "*"


async def test_headless_peer_speaks_the_realtime_route(start_agent: AgentFactory) -> None:
    from agent.testing.peer import run_call
    from signaling.auth import AuthSettings

    running = await start_agent(auth=AuthSettings(api_keys=("sk-peer",)))
    report, _, _ = await run_call(running.url + CALLS, seconds=1.5,
                                  headers={"Authorization": "Bearer sk-peer"})
    assert report.ok, report
    assert report.call_id and report.call_id.startswith("call_")
    assert "session.created" in report.events
    await wait_until(lambda: all_freed(running))


async def test_transcripts_speech_events_and_update_policy(
    start_agent: AgentFactory, realtime_clients: list[RealtimeClient]
) -> None:
    import numpy as np

    from tests.support.text_echo_plugin import VOICES, TextEchoPlugin

    running = await start_agent(plugin=TextEchoPlugin(frames_per_word=2))
    # One second of tone, then silence: the agent speaks, then stops.
    t = np.arange(PEER_RATE) / PEER_RATE
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    client = RealtimeClient(running.url, signal=tone)
    realtime_clients.append(client)
    await client.call({"audio": {"output": {"voice": VOICES[1]}}}, multipart=True)
    created = await client.wait_event("session.created")
    assert created["session"]["voice"] == VOICES[1]
    assert created["session"]["capabilities"]["voices"] == list(VOICES)

    # The model talks from the first frame, maybe before the channel opened: judge the
    # segment after the first complete one, whose every delta was delivered.
    first_done = await client.wait_event("response.output_audio_transcript.done")
    start = client.events.index(first_done) + 1
    done = await client.wait_event("response.output_audio_transcript.done", after=start)
    deltas = [e for e in client.events[start: client.events.index(done)]
              if e["type"] == "response.output_audio_transcript.delta"]
    assert "".join(e["delta"] for e in deltas) == done["transcript"]
    assert done["transcript"] in ("Hello there. ", "This is the test agent speaking. ")
    assert {e["response_id"] for e in deltas} == {done["response_id"]}
    started = await client.wait_event("output_audio_buffer.started")
    stopped = await client.wait_event("output_audio_buffer.stopped")
    assert stopped["response_id"] == started["response_id"]

    # The plugin's policy: no voice change mid-call (a coded error, the call goes on) ...
    mark = await client.send_event({"type": "session.update", "event_id": "evt_v",
                                    "session": {"voice": VOICES[0]}})
    error = (await client.wait_event("error", after=mark))["error"]
    assert (error["code"], error["param"], error["event_id"]) == (
        "voice_update_unsupported", "session.voice", "evt_v")
    # ... but new instructions are taken.
    mark = await client.send_event({"type": "session.update",
                                    "session": {"instructions": "speak slowly"}})
    updated = await client.wait_event("session.updated", after=mark)
    assert (updated["session"]["voice"], updated["session"]["instructions"]) == (
        VOICES[1], "speak slowly")
    assert client.pc.connectionState == "connected"

    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "/v1/models") as response:
            model = (await response.json())["data"][0]
        assert (model["id"], model["voices"], model["default_voice"]) == (
            "text-echo", list(VOICES), VOICES[0])
        async with http.delete(running.url + client.location) as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))
