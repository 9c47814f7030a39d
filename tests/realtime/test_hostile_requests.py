"""Malformed and hostile requests across the Realtime routes: each gets its status and code,
nothing is left behind, and a good call works afterwards."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from agent.plugins.base import RuntimeConfig, SessionConfig
from agent.plugins.echo import EchoPlugin
from agent.plugins.moshi_defaults import DEFAULT_VOICE
from agent.plugins.personaplex import policy
from tests.support.agents import AgentFactory, RunningAgent, all_freed, wait_until
from tests.support.realtime import CALLS, RealtimeClient, offer_sdp_once

HEAD = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
VIDEO_ONLY = (HEAD + "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\n"
              "a=rtpmap:96 VP8/90000\r\n")
GARBLED_AUDIO = HEAD + "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nthis is not sdp\r\n"
NO_COMMON_CODEC = (
    HEAD + "m=audio 9 UDP/TLS/RTP/SAVPF 100\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=sendrecv\r\n"
    "a=rtcp-mux\r\na=rtpmap:100 SILK/16000\r\na=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\na=fingerprint:sha-256 " + ":".join(["AA"] * 32)
    + "\r\na=setup:actpass\r\n"
)
SDP = "application/sdp"
TRICKLE = "application/trickle-ice-sdpfrag"


class VoicedEcho(EchoPlugin):
    """Echo with PersonaPlex's real voice and private-key policy, to test their refusals."""

    id = "voiced-echo"
    private_keys = policy.PRIVATE_EXTRA_BODY_KEYS

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        voice = policy.validate_voice(session_config.voice, ("NATF2.pt",), DEFAULT_VOICE)
        config = await super().prepare_runtime_config(session_config)
        return RuntimeConfig(voice=voice, instructions=config.instructions,
                             options=config.options)


def form(fields: list[tuple[str, str]]) -> aiohttp.FormData:
    data = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields:
        data.add_field(name, value)
    return data


async def chunked_body(data: bytes):  # noqa: ANN201 - an async generator body
    yield data


def chunked(data: bytes) -> Any:
    return chunked_body(data)


def offer_requests(sdp: str) -> list[tuple[str, dict[str, Any], int, str]]:
    """(label, request kwargs, status, code) for POST /v1/realtime/calls."""
    session = lambda obj: form([("sdp", sdp), ("session", json.dumps(obj))])  # noqa: E731
    return [
        ("text/plain", {"data": sdp, "headers": {"Content-Type": "text/plain"}}, 415,
         "unsupported_media_type"),
        ("json offer", {"json": {"type": "offer", "sdp": sdp}}, 415, "unsupported_media_type"),
        ("no body", {"headers": {"Content-Type": SDP}}, 400, "invalid_sdp"),
        ("not sdp", {"data": "hello", "headers": {"Content-Type": SDP}}, 400, "invalid_sdp"),
        ("video only", {"data": VIDEO_ONLY, "headers": {"Content-Type": SDP}}, 400, "no_audio"),
        ("garbled", {"data": GARBLED_AUDIO, "headers": {"Content-Type": SDP}}, 400,
         "invalid_sdp"),
        ("no codec", {"data": NO_COMMON_CODEC, "headers": {"Content-Type": SDP}}, 400,
         "no_common_codec"),
        ("not utf-8", {"data": b"v=0\r\n\xff\xfe\r\n", "headers": {"Content-Type": SDP}}, 400,
         "invalid_encoding"),
        ("sdp over 64 KiB", {"data": sdp + "a=x:" + "y" * 70_000 + "\r\n",
                             "headers": {"Content-Type": SDP}}, 413, "body_too_large"),
        ("1 MiB body", {"data": b"v" * (1 << 20), "headers": {"Content-Type": SDP}}, 413,
         "body_too_large"),
        ("multipart no sdp", {"data": form([("session", "{}")])}, 400, "missing_sdp"),
        ("multipart bad json", {"data": form([("sdp", sdp), ("session", "{oops")])}, 400,
         "invalid_json"),
        ("multipart unknown field", {"data": form([("sdp", sdp), ("model_dir", "/")])}, 400,
         "unknown_field"),
        ("multipart twice", {"data": form([("sdp", sdp), ("sdp", sdp)])}, 400,
         "duplicate_field"),
        ("multipart garbage", {"data": b"--nope\r\n\r\n", "headers": {
            "Content-Type": "multipart/form-data; boundary=xyz"}}, 400, "invalid_multipart"),
        ("multipart no boundary", {"data": b"x", "headers": {
            "Content-Type": "multipart/form-data"}}, 400, "invalid_multipart"),
        ("multipart 1 MiB", {"data": form([("sdp", sdp), ("session", json.dumps(
            {"instructions": "x" * (1 << 20)}))])}, 413, "body_too_large"),
        ("multipart chunked", {"data": chunked(b"--b\r\n"), "headers": {
            "Content-Type": "multipart/form-data; boundary=b"}}, 411, "length_required"),
        ("session not object", {"data": session(["voice"])}, 400, "invalid_type"),
        ("session type", {"data": session({"type": "transcription"})}, 400, "invalid_value"),
        ("voice number", {"data": session({"audio": {"output": {"voice": 5}}})}, 400,
         "invalid_type"),
        ("voice path", {"data": session({"voice": "../../etc/passwd"})}, 400, "invalid_voice"),
        ("voice abs path", {"data": session({"voice": "/tmp/x.pt"})}, 400, "invalid_voice"),
        ("private key", {"data": session({"extra_body": {"voice_path": "/etc/passwd"}})}, 400,
         "private_option"),
        ("unknown key", {"data": session({"extra_body": {"rm_rf": True}})}, 400,
         "unknown_option"),
        ("bad option", {"data": session({"extra_body": {"delay_frames": -1}})}, 400,
         "invalid_option"),
        ("extra_body list", {"data": session({"extra_body": [1]})}, 400, "invalid_type"),
        ("conflicting voice", {"data": session({"voice": "NATF2.pt",
                                                "audio": {"output": {"voice": "x.pt"}}})},
         400, "conflicting_values"),
    ]


async def expect(response: aiohttp.ClientResponse, status: int, code: str, label: str) -> None:
    async with response:
        assert response.status == status, (label, response.status, await response.text())
        body = await response.json()
        assert body["error"]["code"] == code, (label, body)
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def test_hostile_http_requests(start_agent: AgentFactory,
                                     realtime_clients: list[RealtimeClient]) -> None:
    running = await start_agent(plugin=VoicedEcho())
    sdp = await offer_sdp_once()
    base = running.url
    checked = 0
    async with aiohttp.ClientSession() as http:
        for label, kwargs, status, code in offer_requests(sdp):
            await expect(await http.post(base + CALLS, **kwargs), status, code, label)
            checked += 1

        # One live (unconnected) call to aim the per-call requests at.
        async with http.post(base + CALLS, data=sdp, headers={"Content-Type": SDP}) as created:
            assert created.status == 201
            location, etag = created.headers["Location"], created.headers["ETag"]
        ufrag = next(line[12:] for line in sdp.splitlines() if line.startswith("a=ice-ufrag:"))
        mid = next(line[6:] for line in sdp.splitlines() if line.startswith("a=mid:"))
        cand = "a=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host"
        frag = lambda body: {"data": body, "headers": {"Content-Type": TRICKLE}}  # noqa: E731
        per_call: list[tuple[str, str, str, dict[str, Any], int, str]] = [
            ("delete unknown", "DELETE", CALLS + "/call_unknown", {}, 404, "call_not_found"),
            ("delete traversal", "DELETE", CALLS + "/..%2F..%2Fhealth", {}, 404,
             "call_not_found"),
            ("hangup unknown", "POST", CALLS + "/call_nope/hangup", {}, 404, "call_not_found"),
            ("patch unknown", "PATCH", CALLS + "/call_nope", frag(cand), 404, "call_not_found"),
            ("get unknown", "GET", CALLS + "/call_unknown", {}, 404, "call_not_found"),
            ("put a call", "PUT", location, {}, 405, "method_not_allowed"),
            ("put calls", "PUT", CALLS, {}, 405, "method_not_allowed"),
            ("patch wrong type", "PATCH", location,
             {"data": cand, "headers": {"Content-Type": "text/plain"}}, 415,
             "unsupported_media_type"),
            ("patch wrong etag", "PATCH", location,
             {"data": cand, "headers": {"Content-Type": TRICKLE, "If-Match": '"stale"'}}, 412,
             "etag_mismatch"),
            ("ice restart without If-Match", "PATCH", location,
             frag(f"a=ice-ufrag:other\r\na=ice-pwd:{'p' * 22}\r\nm=audio 9 RTP/AVP 0\r\n"
                  f"a=mid:{mid}\r\n{cand}\r\n"), 428, "precondition_required"),
            ("patch garbage", "PATCH", location, frag("hello world\r\n"), 400,
             "invalid_sdpfrag"),
            ("bad candidate", "PATCH", location,
             frag(f"m=audio 9 RTP/AVP 0\r\na=mid:{mid}\r\na=candidate:1 1 udp\r\n"), 400,
             "invalid_candidate"),
            ("bad port", "PATCH", location,
             frag(f"m=audio 9 RTP/AVP 0\r\na=mid:{mid}\r\n"
                  "a=candidate:1 1 udp 1 127.0.0.1 99999 typ host\r\n"), 400,
             "invalid_candidate"),
            ("unknown mid", "PATCH", location,
             frag(f"a=ice-ufrag:{ufrag}\r\nm=audio 9 RTP/AVP 0\r\na=mid:zz\r\n{cand}\r\n"),
             400, "unknown_mid"),
            ("huge fragment", "PATCH", location, frag("a=x\r\n" * 20_000), 413,
             "body_too_large"),
            ("secret bad json", "POST", "/v1/realtime/client_secrets",
             {"data": "{", "headers": {"Content-Type": "application/json"}}, 400,
             "invalid_json"),
            ("secret array", "POST", "/v1/realtime/client_secrets", {"json": [1]}, 400,
             "invalid_json"),
            ("secret text", "POST", "/v1/realtime/client_secrets",
             {"data": "x", "headers": {"Content-Type": "text/plain"}}, 415,
             "unsupported_media_type"),
            ("secret 1 MiB", "POST", "/v1/realtime/client_secrets",
             {"data": b"[" * (1 << 20), "headers": {"Content-Type": "application/json"}}, 413,
             "body_too_large"),
            ("secret path voice", "POST", "/v1/realtime/client_secrets",
             {"json": {"session": {"voice": "..\\..\\x.pt"}}}, 400, "invalid_voice"),
            ("no such route", "GET", "/v1/realtime/sessions", {}, 404, "not_found"),
        ]
        for label, method, path, kwargs, status, code in per_call:
            await expect(await http.request(method, base + path, **kwargs), status, code, label)
            checked += 1
        # The call survived all of that; a good trickle with the right ETag still works.
        async with http.patch(base + location, data=f"m=audio 9 RTP/AVP 0\r\na=mid:{mid}\r\n"
                              f"{cand}\r\n", headers={"Content-Type": TRICKLE,
                                                      "If-Match": etag}) as response:
            assert response.status == 204
        async with http.delete(base + location) as response:
            assert response.status == 200
    assert checked >= 45
    await wait_until(lambda: all_freed(running))
    await good_call_works(running, realtime_clients)


async def good_call_works(running: RunningAgent, clients: list[RealtimeClient]) -> None:
    client = RealtimeClient(running.url)
    clients.append(client)
    await client.call({"voice": "NATF2.pt"})
    await client.wait_event("session.created")
    await client.wait_audio(0.5)
    async with aiohttp.ClientSession() as http:
        async with http.delete(running.url + client.location) as response:
            assert response.status == 200
    await wait_until(lambda: all_freed(running))


DATA_CHANNEL_CASES: list[tuple[str, str | bytes, str, str | None]] = [
    ("not json", "{nope", "invalid_json", None),
    ("json array", "[1, 2]", "invalid_event", None),
    ("no type", '{"event_id": "e1"}', "missing_type", "type"),
    ("type not string", '{"type": 5}', "missing_type", "type"),
    ("unknown type", '{"type": "conversation.item.create", "event_id": "e2"}',
     "unknown_event", "type"),
    ("event_id number", '{"type": "response.cancel", "event_id": 7}', "invalid_type",
     "event_id"),
    ("session string", '{"type": "session.update", "session": "x"}', "invalid_type", "session"),
    ("no session", '{"type": "session.update"}', "invalid_type", "session"),
    ("instructions number", '{"type": "session.update", "session": {"instructions": 5}}',
     "invalid_type", "session.instructions"),
    ("voice object", '{"type": "session.update", "session": {"audio": {"output": '
     '{"voice": {}}}}}', "invalid_type", "session.audio.output.voice"),
    ("private key", '{"type": "session.update", "session": {"extra_body": '
     '{"prompt_snapshot": 1}}}', "private_option", "extra_body.prompt_snapshot"),
    ("path voice", '{"type": "session.update", "session": {"voice": "../x.pt"}}',
     "invalid_voice", "session.voice"),
    ("not utf-8", b"\xff\xfe\xfd", "invalid_json", None),
    ("oversized", json.dumps({"type": "session.update", "session": {"instructions":
                                                                    "x" * 100_000}}),
     "message_too_large", None),
]


class VoicedEchoUpdates(VoicedEcho):
    def runtime_config_for_update(self, current: RuntimeConfig, update: SessionConfig
                                  ) -> RuntimeConfig:
        if update.voice is not None:
            policy.validate_voice(update.voice, ("NATF2.pt",), DEFAULT_VOICE)
        return super().runtime_config_for_update(current, update)


async def test_hostile_data_channel_events(start_agent: AgentFactory,
                                           realtime_clients: list[RealtimeClient]) -> None:
    running = await start_agent(plugin=VoicedEchoUpdates())
    client = RealtimeClient(running.url)
    realtime_clients.append(client)
    await client.call()
    await client.wait_event("session.created")
    client.ignore_max_message_size()
    for label, raw, code, param in DATA_CHANNEL_CASES:
        mark = await client.send_event(raw)
        error = (await client.wait_event("error", after=mark))["error"]
        assert error["code"] == code, (label, error)
        assert error["param"] == param, (label, error)
        assert error["type"] == "invalid_request_error"
    # The client event id is echoed on the error it caused.
    mark = await client.send_event({"type": "bogus", "event_id": "evt_42"})
    assert (await client.wait_event("error", after=mark))["error"]["event_id"] == "evt_42"
    mark = await client.send_event({"event_id": "evt_43"})  # refused before dispatch
    assert (await client.wait_event("error", after=mark))["error"]["event_id"] == "evt_43"
    # The session is still open and still takes good events.
    mark = await client.send_event({"type": "session.update",
                                    "session": {"instructions": "still here"}})
    updated = await client.wait_event("session.updated", after=mark)
    assert updated["session"]["instructions"] == "still here"
    assert client.call_id in running.agent.webrtc_legs
    await client.close()
    await wait_until(lambda: all_freed(running))
    await good_call_works(running, realtime_clients)


async def test_data_channel_flood_is_rate_limited(start_agent: AgentFactory,
                                                  realtime_clients: list[RealtimeClient]) -> None:
    """500 restarts at once: the burst is served, the rest refused with few error events,
    the flooding call still works and the other call keeps getting its audio."""
    running = await start_agent(plugin=VoicedEchoUpdates())
    settings = running.agent.settings.call
    victim, flooder = RealtimeClient(running.url), RealtimeClient(running.url)
    realtime_clients.extend([victim, flooder])
    await victim.call()
    await flooder.call()
    await flooder.wait_event("session.created")
    await victim.wait_audio(0.5)
    loop = asyncio.get_running_loop()
    began = loop.time()
    heard_before = victim.received_seconds
    mark = await flooder.send_event({"type": "response.cancel", "event_id": "flood_0"})
    for i in range(1, 500):
        flooder.channel.send(json.dumps({"type": "response.cancel", "event_id": f"flood_{i}"}))
    refusal = (await flooder.wait_event("error", after=mark))["error"]
    assert refusal["code"] == "rate_limited"
    assert refusal["event_id"].startswith("flood_")
    await asyncio.sleep(2.0)
    elapsed = loop.time() - began
    replies = flooder.events[mark:]
    cleared = sum(e["type"] == "output_audio_buffer.cleared" for e in replies)
    errors = [e["error"] for e in replies if e["type"] == "error"]
    assert settings.client_event_burst <= cleared
    assert cleared <= settings.client_event_burst + settings.client_event_rate * elapsed + 1
    assert {error["code"] for error in errors} == {"rate_limited"}
    assert len(errors) <= 1 + elapsed  # refusals are reported at most once a second
    # Every event was either handled (its `cleared` reached the client) or refused.
    call = running.agent.webrtc_legs[flooder.call_id]
    await wait_until(lambda: call.realtime.inbox.refused + sum(
        e["type"] == "output_audio_buffer.cleared" for e in flooder.events[mark:]) == 500)
    # The flooder's call goes on and takes events again once the burst is refilled.
    mark = await flooder.send_event({"type": "session.update",
                                     "session": {"instructions": "calm again"}})
    updated = await flooder.wait_event("session.updated", after=mark)
    assert updated["session"]["instructions"] == "calm again"
    # The other call was served meanwhile.
    assert victim.received_seconds - heard_before >= elapsed - 1.0
    assert victim.pc.connectionState == "connected"
