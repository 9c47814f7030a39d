"""ICE restart on a live call (agent/rtc_tuning/ice_restart.py, the call resource's PATCH and
re-offer) and the reconnect grace (--reconnect-seconds): real aiortc callers, a real agent
server on loopback, and a userspace UDP path between them that a test can cut or replace
(a network change)."""

from __future__ import annotations

import asyncio
import glob
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import aioice.ice
import av
import pytest
from aiortc import RTCSessionDescription

from agent.call_settings import CallSettings
from agent.media_agent import AgentSettings
from agent.rtc_tuning.ice_restart import (
    IceCredentials,
    LocalIce,
    RestartableIce,
    answer_with_ice,
    missing_restart_internals,
    read_offered_ice,
    restart_sdpfrag,
)
from agent.testing.peer import PEER_RATE
from agent.testing.testsignal import measure_echo
from agent.webrtc.trickle import parse_sdpfrag
from signaling.auth import AuthSettings
from tests.support.agents import AgentFactory, RunningAgent, wait_until
from tests.support.realtime import RealtimeClient, offer_sdp_once
from tests.support.udp_path import UdpPath

TRICKLE = "application/trickle-ice-sdpfrag"
SDP = "application/sdp"
KEY = "sk-restart-0123456789"
OTHER_KEY = "sk-restart-other-987654"


# -- a caller that can restart -----------------------------------------------------------------


@dataclass
class Caller:
    client: RealtimeClient
    ice: RestartableIce
    path: UdpPath
    offer: str

    @property
    def location(self) -> str:
        assert self.client.location is not None
        return self.client.location

    def session_created(self) -> int:
        return sum(1 for e in self.client.events if e.get("type") == "session.created")


async def place_call(running: RunningAgent, clients: list[RealtimeClient], paths: list[UdpPath],
                     token: str | None = None) -> Caller:
    client = RealtimeClient(running.url, token=token, seconds=60)
    clients.append(client)
    path = await UdpPath.open()
    paths.append(path)
    offer = await client.offer_sdp()
    async with aiohttp.ClientSession() as http:
        async with await client.post(http, path.from_caller(offer)) as response:
            body = await response.text()
            assert response.status == 201, body
            client.location = response.headers["Location"]
            client.etag = response.headers["ETag"]
    await client.pc.setRemoteDescription(RTCSessionDescription(path.from_agent(body), "answer"))
    ice = RestartableIce.install(client.pc)  # before aiortc starts ICE (a task not yet run)
    assert ice is not None
    await asyncio.wait_for(client.connected.wait(), 15)
    return Caller(client, ice, path, offer)


async def restart_by_patch(caller: Caller, path: UdpPath, etag: str | None) -> str:
    """The caller restarts ICE over `path` with a PATCH; returns the new ETag."""
    local = await caller.ice.begin()
    frag = path.from_caller(restart_sdpfrag(local, "0"))
    headers = {**caller.client.headers, "Content-Type": TRICKLE}
    if etag is not None:
        headers["If-Match"] = etag
    async with aiohttp.ClientSession() as http, http.patch(
            caller.client.base_url + caller.location, data=frag, headers=headers) as response:
        body = await response.text()
        assert response.status == 200, body
        assert response.content_type == TRICKLE
        new_etag = response.headers["ETag"]
    answer = parse_sdpfrag(path.from_agent(body))
    assert answer.ice_ufrag and answer.ice_pwd and answer.candidates and answer.ended_mids
    await caller.ice.connect(IceCredentials(answer.ice_ufrag, answer.ice_pwd),
                             answer.candidates, ended=True)
    return new_etag


async def audio_again(client: RealtimeClient, seconds: float, timeout: float = 15.0) -> None:
    start = client.received_seconds
    await client.wait_audio(start + seconds, timeout)


def echo_after(client: RealtimeClient, sent_mark: int, received_mark: int) -> float:
    """How well the audio received after `received_mark` echoes what was sent from
    `sent_mark` on (a point sent after the first audio of the tail came back, so the echo
    lags it, as measure_echo expects; the outage is in neither part)."""
    sent = client.signal[sent_mark: client.source.position]
    received = client.recording.samples()[received_mark:]
    return measure_echo(sent, received, PEER_RATE).correlation


def recorded_seconds(path: str) -> float:
    with av.open(path) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


@pytest.fixture
async def paths() -> AsyncIterator[list[UdpPath]]:
    made: list[UdpPath] = []
    yield made
    for path in made:
        path.close()


# -- tests ---------------------------------------------------------------------------------------


def test_internals_present() -> None:
    assert missing_restart_internals() == []


def test_answer_with_ice_keeps_all_but_ice() -> None:
    answer = ("v=0\r\nm=audio 5000 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 10.0.0.1\r\na=mid:0\r\n"
              "a=candidate:a 1 udp 1 10.0.0.1 5000 typ host\r\na=end-of-candidates\r\n"
              "a=ice-ufrag:old\r\na=ice-pwd:oldoldoldoldoldoldoldold\r\n"
              "a=fingerprint:sha-256 AB:CD\r\na=setup:active\r\n")
    fresh = read_offered_ice("m=audio 9 X 0\r\na=mid:0\r\n"
                             "a=candidate:b 1 udp 7 10.0.0.2 6000 typ host\r\n")
    local = LocalIce(IceCredentials("new1", "n" * 22), fresh.candidates)
    out = answer_with_ice(answer, local)
    read = read_offered_ice(out)
    assert read.credentials == IceCredentials("new1", "n" * 22)
    assert [(c.ip, c.port) for c in read.candidates] == [("10.0.0.2", 6000)]
    assert read.fingerprints == frozenset({"sha-256 ab:cd"}) and read.ended
    assert "m=audio 6000 " in out and "c=IN IP4 10.0.0.2" in out and "a=setup:active" in out
    frag = parse_sdpfrag(restart_sdpfrag(local, "0"))
    assert (frag.ice_ufrag, frag.ice_pwd, frag.ended_mids) == ("new1", "n" * 22, ["0"])


@pytest.mark.slow
async def test_patch_restart_over_a_new_network(start_agent: AgentFactory, tmp_path: Path,
                                                realtime_clients: list[RealtimeClient],
                                                paths: list[UdpPath]) -> None:
    settings = AgentSettings(call=CallSettings(record_dir=str(tmp_path)))
    running = await start_agent(settings=settings)
    caller = await place_call(running, realtime_clients, paths)
    client = caller.client
    await client.wait_event("session.created")
    await client.wait_audio(1.5)
    leg = running.agent.webrtc_legs[client.call_id]
    first_etag = client.etag
    assert first_etag is not None

    caller.path.drop = True  # the caller's network is gone
    await asyncio.sleep(0.3)
    new_path = await UdpPath.open()
    paths.append(new_path)
    received_mark = int(client.received_seconds * PEER_RATE)
    started = time.monotonic()
    new_etag = await restart_by_patch(caller, new_path, first_etag)
    await audio_again(client, 0.2)
    print(f"audio again {time.monotonic() - started:.2f} s after the restart PATCH")
    sent_mark = client.source.position
    await audio_again(client, 2.5)

    assert new_etag != first_etag
    assert new_path.relayed > 0
    assert running.agent.webrtc_legs[client.call_id] is leg and len(running.agent.legs) == 1
    assert leg.ice.restarts_completed == 1
    assert caller.session_created() == 1
    assert echo_after(client, sent_mark, received_mark) >= 0.7
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + caller.location) as response:
            body = await response.json()
            assert response.status == 200 and body["id"] == client.call_id
            assert response.headers["ETag"] == new_etag
            assert body["stats"]["ice_restarts"] == 1
        # The first generation's ETag is stale now.
        async with http.patch(running.url + caller.location, data="a=ice-ufrag:zzzz\r\n",
                              headers={"Content-Type": TRICKLE,
                                       "If-Match": first_etag}) as response:
            assert response.status == 412
            assert (await response.json())["error"]["code"] == "etag_mismatch"
        async with http.delete(running.url + caller.location) as response:
            assert response.status == 200
    await leg.closed.wait()
    assert leg.end_reason == "hangup"
    # One recording for the whole call, restart included: the ticker kept its seat.
    files = glob.glob(f"{tmp_path}/**/*{client.call_id}*.flac", recursive=True)
    assert len(files) == 1, files
    assert recorded_seconds(files[0]) >= leg.stats()["age_s"] - 1.0


@pytest.mark.slow
async def test_reoffer_restarts_ice(start_agent: AgentFactory,
                                    realtime_clients: list[RealtimeClient],
                                    paths: list[UdpPath]) -> None:
    running = await start_agent()
    caller = await place_call(running, realtime_clients, paths)
    client = caller.client
    await client.wait_event("session.created")
    await client.wait_audio(1.0)
    caller.path.drop = True
    new_path = await UdpPath.open()
    paths.append(new_path)
    local = await caller.ice.begin()
    reoffer = new_path.from_caller(answer_with_ice(caller.offer, local))
    async with aiohttp.ClientSession() as http, http.post(
            running.url + caller.location, data=reoffer,
            headers={"Content-Type": SDP}) as response:
        answer = await response.text()
        assert response.status == 200, answer
        assert response.headers["ETag"] != client.etag
    read = read_offered_ice(new_path.from_agent(answer))
    assert read.credentials is not None
    assert read.credentials != read_offered_ice(caller.offer).credentials
    received_mark = int(client.received_seconds * PEER_RATE)
    await caller.ice.connect(read.credentials, read.candidates, ended=True)
    await audio_again(client, 0.2)
    sent_mark = client.source.position
    await audio_again(client, 2.5)
    assert echo_after(client, sent_mark, received_mark) >= 0.7
    assert caller.session_created() == 1 and len(running.agent.legs) == 1
    assert running.agent.webrtc_legs[client.call_id].ice_generation == 1


async def test_restart_bad_input(start_agent: AgentFactory,
                                 realtime_clients: list[RealtimeClient],
                                 paths: list[UdpPath]) -> None:
    running = await start_agent(auth=AuthSettings(api_keys=(KEY, OTHER_KEY)))
    caller = await place_call(running, realtime_clients, paths, token=KEY)
    url = running.url + caller.location
    etag = caller.client.etag
    assert etag is not None
    restart = "a=ice-ufrag:abcd\r\na=ice-pwd:" + "p" * 22 + "\r\n"

    async def expect(method: str, status: int, code: str, data: str, token: str = KEY,
                     **headers: str) -> None:
        headers.setdefault("Content-Type", TRICKLE)
        async with aiohttp.ClientSession() as http, http.request(
                method, url, data=data,
                headers={"Authorization": f"Bearer {token}", **headers}) as response:
            assert response.status == status, await response.text()
            assert response.content_type == "application/json"
            assert (await response.json())["error"]["code"] == code

    await expect("PATCH", 404, "call_not_found", restart, token=OTHER_KEY, **{"If-Match": "*"})
    await expect("PATCH", 428, "precondition_required", restart)
    await expect("PATCH", 412, "etag_mismatch", restart, **{"If-Match": '"stale"'})
    await expect("PATCH", 400, "invalid_sdpfrag", "not a fragment\r\n", **{"If-Match": etag})
    await expect("PATCH", 400, "invalid_sdpfrag", "a=ice-ufrag:abcd\r\n", **{"If-Match": etag})
    await expect("PATCH", 400, "invalid_candidate",
                 restart + "m=audio 9 X 0\r\na=mid:0\r\na=candidate:1 1 udp\r\n",
                 **{"If-Match": etag})
    await expect("PATCH", 400, "unknown_mid",
                 restart + "m=audio 9 X 0\r\na=mid:zz\r\n"
                 "a=candidate:1 1 udp 1 127.0.0.1 9 typ host\r\n", **{"If-Match": etag})
    await expect("POST", 404, "call_not_found", caller.offer, token=OTHER_KEY,
                 **{"Content-Type": SDP})
    await expect("POST", 415, "unsupported_media_type", caller.offer)
    other_cert = caller.offer.replace("a=fingerprint:sha-256 ", "a=fingerprint:sha-256 00")
    await expect("POST", 422, "dtls_restart_unsupported",
                 answer_with_ice(other_cert, LocalIce(IceCredentials("wxyz", "q" * 22))),
                 **{"Content-Type": SDP})
    await expect("POST", 400, "invalid_sdp", "v=0\r\n", **{"Content-Type": SDP})
    # A call whose ICE never connected cannot restart it (aiortc still runs its first checks).
    async with aiohttp.ClientSession() as http:
        async with http.post(running.url + "/v1/realtime/calls", data=await offer_sdp_once(),
                             headers={"Content-Type": SDP,
                                      "Authorization": f"Bearer {KEY}"}) as response:
            assert response.status == 201
            unconnected = response.headers["Location"]
        async with http.patch(running.url + unconnected, data=restart,
                              headers={"Content-Type": TRICKLE, "If-Match": "*",
                                       "Authorization": f"Bearer {KEY}"}) as response:
            assert response.status == 409
            assert (await response.json())["error"]["code"] == "ice_not_connected"
    # None of that touched the call: it still echoes on its first ICE generation.
    leg = running.agent.webrtc_legs[caller.client.call_id]
    assert leg.ice_generation == 0 and not leg.closing
    await audio_again(caller.client, 0.5)


@pytest.mark.slow
async def test_caller_pausing_keeps_the_call(start_agent: AgentFactory,
                                             realtime_clients: list[RealtimeClient],
                                             paths: list[UdpPath]) -> None:
    running = await start_agent(settings=AgentSettings(reconnect_seconds=10.0))
    caller = await place_call(running, realtime_clients, paths)
    await caller.client.wait_audio(1.0)
    leg = running.agent.webrtc_legs[caller.client.call_id]
    caller.path.drop = True  # silent past the 3 s that count as disconnected
    now = time.monotonic()
    await wait_until(lambda: leg.ice.path_down(time.monotonic(), leg.connected_at), timeout=10)
    assert time.monotonic() - now >= 2.5
    await asyncio.sleep(1.0)  # past the leg's next look at its path
    caller.path.drop = False  # back on the same path, no restart
    await audio_again(caller.client, 1.0)
    await wait_until(lambda: leg.ice.reconnects == 1, timeout=5)
    assert not leg.closing and leg.ice_generation == 0


@pytest.mark.slow
async def test_a_lost_path_ends_the_call_after_the_grace(
        start_agent: AgentFactory, realtime_clients: list[RealtimeClient],
        paths: list[UdpPath]) -> None:
    running = await start_agent(settings=AgentSettings(reconnect_seconds=1.0))
    caller = await place_call(running, realtime_clients, paths)
    await caller.client.wait_audio(0.5)
    leg = running.agent.webrtc_legs[caller.client.call_id]
    caller.path.drop = True
    await asyncio.wait_for(leg.closed.wait(), 20)
    assert leg.end_reason == "connection_lost"
    assert not running.agent.legs


@pytest.mark.slow
async def test_restart_after_consent_expired(start_agent: AgentFactory,
                                             realtime_clients: list[RealtimeClient],
                                             paths: list[UdpPath],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # RFC 7675's 5 s checks made 0.1 s, so consent expires (6 failures) in under 1 s.
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.1)
    running = await start_agent()
    caller = await place_call(running, realtime_clients, paths)
    await caller.client.wait_audio(0.5)
    leg = running.agent.webrtc_legs[caller.client.call_id]
    caller.path.drop = True
    await wait_until(lambda: leg.pc.connectionState == "failed", timeout=10)
    assert not leg.closing  # failed, but within --reconnect-seconds
    new_path = await UdpPath.open()
    paths.append(new_path)
    await restart_by_patch(caller, new_path, "*")
    await audio_again(caller.client, 1.0)
    assert leg.pc.connectionState == "connected" and not leg.closing
    assert leg.ice.restarts_completed == 1


@pytest.mark.slow
async def test_restart_then_trickled_candidates(start_agent: AgentFactory,
                                                realtime_clients: list[RealtimeClient],
                                                paths: list[UdpPath]) -> None:
    """A restart PATCH with credentials only; the caller's candidates follow in a trickle
    PATCH for the new generation (If-Match: the new ETag)."""
    running = await start_agent()
    caller = await place_call(running, realtime_clients, paths)
    client = caller.client
    await client.wait_audio(0.5)
    caller.path.drop = True
    new_path = await UdpPath.open()
    paths.append(new_path)
    local = await caller.ice.begin()
    url = running.url + caller.location
    async with aiohttp.ClientSession() as http:
        credentials_only = (f"a=ice-ufrag:{local.credentials.ufrag}\r\n"
                            f"a=ice-pwd:{local.credentials.pwd}\r\n")
        async with http.patch(url, data=credentials_only,
                              headers={"Content-Type": TRICKLE,
                                       "If-Match": client.etag or "*"}) as response:
            body = await response.text()
            assert response.status == 200, body
            etag = response.headers["ETag"]
        answer = parse_sdpfrag(new_path.from_agent(body))
        assert answer.ice_ufrag and answer.ice_pwd
        trickled = new_path.from_caller(restart_sdpfrag(local, "0"))
        async with http.patch(url, data=trickled,
                              headers={"Content-Type": TRICKLE, "If-Match": etag}) as response:
            assert response.status == 204, await response.text()
            assert response.headers["ETag"] == etag  # trickle keeps the generation
        # A second end-of-candidates for the same generation is refused, coded.
        async with http.patch(url, data=trickled,
                              headers={"Content-Type": TRICKLE, "If-Match": etag}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "candidates_ended"
    await caller.ice.connect(IceCredentials(answer.ice_ufrag, answer.ice_pwd),
                             answer.candidates, ended=True)
    await audio_again(client, 1.0)
    leg = running.agent.webrtc_legs[client.call_id]
    assert leg.ice.restarts_completed == 1 and not leg.closing
