"""Outbound SIP calls (signaling/sip/outbound.py, outbound_api.py, trunks.py) against sipp as
the far end: answered with RTP both ways, busy, no answer, a digest challenge checked by sipp
(`verifyauth`), a second challenge; and the API's refusals of bad input."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.testing.testsignal import make_test_signal
from signaling.auth import AuthSettings
from signaling.sip.config import SipConfig
from signaling.sip.message import Headers, SipRequest, SipResponse
from signaling.sip.service import SIP_SERVICE_KEY
from signaling.sip.timers import TimerSettings
from signaling.sip.trunks import TrunkFileError, load_trunks, parse_trunks
from tests.sip import uas_scenarios
from tests.sip.helpers import (
    HOST,
    Dialogue,
    RtpProbe,
    SipPeer,
    SipServer,
    SipServerFactory,
    establish,
    free_udp_port,
    sdp_offer,
    write_mulaw_wav,
)
from tests.sip.outbound_helpers import (
    TRUNKS,
    answered_call,
    dialing_server,
    get_call,
    place,
    sip_to,
    sipp_uas,
    until_idle,
    wait_status,
)
from tests.sip.test_sip_cli import run as run_server
from tests.sip.test_sip_guard import peer_at
from tests.sip.test_sip_webhook import receiver_factory, webhook_server  # noqa: F401
from tests.support.agents import wait_until
from tests.support.server_process import running_server

pytestmark = pytest.mark.interop


@pytest.fixture
async def dialing(start_sip: SipServerFactory) -> SipServer:
    return await dialing_server(start_sip)


async def test_answered_call_carries_rtp_both_ways_and_hangs_up(dialing: SipServer,
                                                                tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.answer_then_hangup_from_agent(),
                               "-mp", str(free_udp_port()), "-rtp_echo")
    status, body, location = await place(dialing, {"to": sip_to(port),
                                                   "headers": {"X-Case": "answer-1"}})
    assert status == 201, body
    call_id = body["id"]
    assert call_id.startswith("sip_") and location == f"/v1/sip/calls/{call_id}"
    assert body["object"] == "realtime.call" and body["status"] in ("calling", "ringing")
    call = await wait_status(dialing, call_id, "answered")
    assert [e["type"] for e in call["events"]] == ["call.ringing", "call.early_media",
                                                   "call.answered"]
    leg = dialing.agent.legs.get(call_id)
    assert leg is not None and leg.transport == "sip"
    for _ in range(100):  # sipp's rtp_echo returns the agent's packets
        if leg.stats()["packets_sent"] > 10 and leg.stats()["remote_source"]:
            break
        await asyncio.sleep(0.05)
    stats = leg.stats()
    assert stats["packets_sent"] > 10 and stats["remote_source"] is not None, stats
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{dialing.url}/metrics/calls") as response:
            assert call_id in await response.text()
        async with http.delete(f"{dialing.url}/v1/sip/calls/{call_id}") as response:
            assert response.status == 200
    call = await wait_status(dialing, call_id, "ended")
    assert call["reason"] == "hangup"
    run = await uas
    assert run.returncode == 0, run.explain()
    assert "X-Case: answer-1" in run.messages
    await until_idle(dialing)


async def test_a_second_fork_is_acked_and_hung_up(dialing: SipServer, tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.two_forks_answer(),
                               "-mp", str(free_udp_port()))
    code, body, _ = await place(dialing, {"to": sip_to(port)})
    await wait_status(dialing, body["id"], "answered")
    for _ in range(200):  # the second fork's BYE (Reason "ended") has reached sipp
        if 'text="ended"' in (tmp_path / "uas.msg.log").read_text():
            break
        await asyncio.sleep(0.05)
    call = await wait_status(dialing, body["id"], "answered")  # the first is kept
    async with aiohttp.ClientSession() as http, http.delete(
            f"{dialing.url}/v1/sip/calls/{body['id']}") as response:
        assert response.status == 200
    assert (await wait_status(dialing, body["id"], "ended"))["reason"] == "hangup"
    run = await uas
    assert run.returncode == 0, run.explain()
    assert run.count("ACK", "received") == 2 and run.count("BYE", "received") == 2
    assert 'text="ended"' in run.messages and "SIPpFork02" in run.messages
    assert call["sip_status"] == 200
    await until_idle(dialing)


@pytest.mark.parametrize(("status", "reason"), [("486 Busy Here", "busy"),
                                                ("600 Busy Everywhere", "busy"),
                                                ("480 Temporarily Unavailable", "no_answer"),
                                                ("404 Not Found", "not_found"),
                                                ("604 Does Not Exist Anywhere", "not_found"),
                                                ("408 Request Timeout", "timeout"),
                                                ("503 Service Unavailable", "rejected")])
async def test_failures_map_to_coded_endings(dialing: SipServer, tmp_path: Path, status: str,
                                             reason: str) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.final_failure(status))
    code, body, _ = await place(dialing, {"to": sip_to(port)})
    assert code == 201
    call = await wait_status(dialing, body["id"], "ended")
    assert call["reason"] == reason and call["sip_status"] == int(status[:3])
    run = await uas
    assert run.returncode == 0, run.explain()  # sipp got its ACK
    await until_idle(dialing)


async def test_no_answer_is_cancelled(dialing: SipServer, tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.ring_until_cancelled())
    code, body, _ = await place(dialing, {"to": sip_to(port), "ring_timeout": 1})
    assert code == 201
    call = await wait_status(dialing, body["id"], "ended")
    assert call["reason"] == "no_answer" and call["sip_status"] == 487
    run = await uas
    assert run.returncode == 0, run.explain()
    assert run.count("CANCEL", "received") == 1
    await until_idle(dialing)


async def test_hangup_before_answer_sends_cancel(dialing: SipServer, tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.ring_until_cancelled())
    code, body, _ = await place(dialing, {"to": sip_to(port)})
    await wait_status(dialing, body["id"], "ringing")
    async with aiohttp.ClientSession() as http, http.post(
            f"{dialing.url}/v1/sip/calls/{body['id']}/hangup") as response:
        assert response.status == 200
    call = await wait_status(dialing, body["id"], "ended")
    assert call["reason"] == "hangup"
    run = await uas
    assert run.returncode == 0, run.explain()
    await until_idle(dialing)


@pytest.mark.parametrize("qop", [True, False])
async def test_digest_challenge_checked_by_sipp(start_sip: SipServerFactory, tmp_path: Path,
                                                qop: bool) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.digest_checked("alice", "s3cret", qop),
                               "-mp", str(free_udp_port()))
    server = await start_sip(config=SipConfig(listen_port=0, trunks=parse_trunks(
        {"t1": {"proxy": f"sip:{HOST}:{port}", "username": "alice", "password": "s3cret"}})))
    code, body, _ = await place(server, {"to": "sip:bob@example.com", "trunk": "t1"})
    assert code == 201, body
    call = await wait_status(server, body["id"], "answered")
    assert call["sip_status"] == 200
    async with aiohttp.ClientSession() as http, http.delete(
            f"{server.url}/v1/sip/calls/{body['id']}") as response:
        assert response.status == 200
    await wait_status(server, body["id"], "ended")
    run = await uas
    assert run.returncode == 0, run.explain()
    assert run.count("INVITE", "received") == 2
    assert "\nAuthorization: Digest" in run.messages and "s3cret" not in run.messages
    assert len(set(re.findall(r"Call-ID: (\S+)", run.messages))) == 1  # one Call-ID
    assert "CSeq: 1 INVITE" in run.messages and "CSeq: 2 INVITE" in run.messages
    await until_idle(server)


async def test_407_gets_proxy_authorization(start_sip: SipServerFactory,
                                            tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.proxy_challenge(),
                               "-mp", str(free_udp_port()))
    server = await start_sip(config=SipConfig(listen_port=0, trunks=parse_trunks(
        {"t1": {"proxy": f"sip:{HOST}:{port}", "username": "alice", "password": "s3cret"}})))
    code, body, _ = await place(server, {"to": "sip:bob@example.com", "trunk": "t1"})
    await wait_status(server, body["id"], "answered")
    async with aiohttp.ClientSession() as http, http.delete(
            f"{server.url}/v1/sip/calls/{body['id']}") as response:
        assert response.status == 200
    run = await uas
    assert run.returncode == 0, run.explain()
    # RFC 2617 §3.2.2 worked out here with hashlib alone, from what sipp received.
    header = re.search(r"Proxy-Authorization: Digest (.*)", run.messages)
    assert header is not None
    fields = dict(re.findall(r'(\w+)="?([^",]*)"?', header.group(1)))
    assert fields["username"] == "alice" and fields["realm"] == "proxy.test"
    assert fields["uri"] == "sip:bob@example.com" and fields["qop"] == "auth"

    def md5(text: str) -> str:
        return hashlib.md5(text.encode()).hexdigest()

    expected = md5(f"{md5('alice:proxy.test:s3cret')}:{fields['nonce']}:{fields['nc']}:"
                   f"{fields['cnonce']}:auth:{md5('INVITE:sip:bob@example.com')}")
    assert fields["response"] == expected
    assert re.search(r"CSeq: 2 INVITE", run.messages)  # the retry: a new CSeq
    await until_idle(server)


async def test_wrong_password_is_refused_by_sipp(start_sip: SipServerFactory,
                                                 tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.digest_checked("alice", "s3cret", True))
    server = await start_sip(config=SipConfig(listen_port=0, trunks=parse_trunks(
        {"t1": {"proxy": f"sip:{HOST}:{port}", "username": "alice", "password": "nope"}})))
    code, body, _ = await place(server, {"to": "sip:bob@example.com", "trunk": "t1"})
    call = await wait_status(server, body["id"], "ended")
    assert call["reason"] == "rejected" and call["sip_status"] == 403
    assert (await uas).returncode == 0


async def test_second_challenge_ends_auth_failed(start_sip: SipServerFactory,
                                                 tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.challenged_twice())
    server = await start_sip(config=SipConfig(listen_port=0, trunks=parse_trunks(
        {"t1": {"proxy": f"sip:{HOST}:{port}", "username": "alice", "password": "s3cret"}})))
    code, body, _ = await place(server, {"to": "sip:bob@example.com", "trunk": "t1"})
    call = await wait_status(server, body["id"], "ended")
    assert call["reason"] == "auth_failed" and call["sip_status"] == 401
    run = await uas
    assert run.returncode == 0, run.explain()
    assert run.count("INVITE", "received") == 2
    await until_idle(server)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "code"), [
    ({"to": "tel:+1555"}, "invalid_uri"),
    ({"to": "sip:bob@host\r\nVia: x"}, "invalid_uri"),
    ({}, "invalid_uri"),
    ({"to": "sip:bob@127.0.0.1", "trunk": "nope"}, "unknown_trunk"),
    ({"to": "sip:bob@127.0.0.1", "headers": {"X-A": "1\r\nBYE sip:x SIP/2.0"}},
     "invalid_header"),
    ({"to": "sip:bob@127.0.0.1", "headers": {"Via": "SIP/2.0/UDP 10.0.0.1"}},
     "forbidden_header"),
    ({"to": "sip:bob@127.0.0.1", "headers": {"i": "x"}}, "forbidden_header"),
    ({"to": "sip:bob@127.0.0.1", "headers": {"CSeq": "1 BYE"}}, "forbidden_header"),
    ({"to": "sip:bob@127.0.0.1", "headers": {"Bad Name": "x"}}, "invalid_header"),
    ({"to": "sip:bob@127.0.0.1", "headers": ["X-A"]}, "invalid_header"),
    ({"to": "sip:bob@127.0.0.1", "from": "sip:a@b>;tag=1"}, "invalid_uri"),
    ({"to": "sip:bob@127.0.0.1", "ring_timeout": 0}, "invalid_value"),
    ({"to": "sip:bob@127.0.0.1", "session": "x"}, "invalid_value"),
    ({"to": "sip:bob@8.8.8.8"}, "destination_not_allowed"),
])
async def test_bad_requests_are_coded(dialing: SipServer, body: dict[str, Any],
                                      code: str) -> None:
    status, answer, _ = await place(dialing, body)
    assert 400 <= status < 500 and answer["error"]["code"] == code, answer
    await until_idle(dialing)


async def test_bad_json_and_foreign_calls(dialing: SipServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{dialing.url}/v1/sip/calls", data=b"{not json",
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_json"
        async with http.get(f"{dialing.url}/v1/sip/calls/sip_unknown") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "call_not_found"
        async with http.post(f"{dialing.url}/v1/realtime/calls/sip_unknown/refer",
                             json={"target_uri": "tel:+1555"}) as response:
            assert response.status == 404


def test_trunk_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "trunks.json"
    path.write_text(json.dumps(TRUNKS))
    trunks = load_trunks(path)
    assert trunks["t1"].proxy.port == 5999 and trunks["t1"].transport == "UDP"
    assert "s3cret" not in repr(trunks)
    cases = {
        '{"t1": {"proxy": "http://x"}}': "'proxy' must be a sip: URI",
        '{"t1": {"proxy": "sip:h", "username": "u"}}': "both 'username' and 'password'",
        '{"t1": {"proxy": "sip:h", "colour": 1}}': "unknown field",
        '{"t1": {"proxy": "sip:h", "transport": "sctp"}}': "udp or tcp",
        '["t1"]': "JSON object of named trunks",
        '{"t1": {"proxy": "sip:h", "password": "s3cret': "not valid JSON",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(TrunkFileError, match=message) as caught:
            load_trunks(path)
        assert "s3cret" not in str(caught.value)
    with pytest.raises(TrunkFileError, match="cannot read"):
        load_trunks(tmp_path / "missing.json")


class SilentPeer(asyncio.DatagramProtocol):
    """A far end that takes every datagram and answers none."""

    def __init__(self) -> None:
        self.received: list[bytes] = []

    def datagram_received(self, data: bytes, addr: tuple[object, ...]) -> None:
        self.received.append(data)


async def test_owner_only_and_timer_b(start_sip: SipServerFactory) -> None:
    """Another key's GET/DELETE/hangup is a 404; an INVITE nobody answers is retransmitted
    (Timer A, same branch) until Timer B ends the call `timeout`."""
    loop = asyncio.get_running_loop()
    transport, silent = await loop.create_datagram_endpoint(SilentPeer, local_addr=(HOST, 0))
    port = transport.get_extra_info("sockname")[1]
    server = await start_sip(config=SipConfig(listen_port=0, timers=TimerSettings(t1=0.05)),
                             auth=AuthSettings(api_keys=("key-a", "key-b")))
    try:
        code, body, _ = await place(server, {"to": sip_to(port)}, key="key-a")
        assert code == 201, body
        url = f"{server.url}/v1/sip/calls/{body['id']}"
        other = {"Authorization": "Bearer key-b"}
        async with aiohttp.ClientSession() as http:
            for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/hangup")):
                async with http.request(method, url + path, headers=other) as response:
                    assert response.status == 404
                    assert (await response.json())["error"]["code"] == "call_not_found"
            async with http.get(url) as response:
                assert response.status == 401  # no key at all
        call = await wait_status(server, body["id"], "ended", key="key-a")
        assert call["reason"] == "timeout" and call["sip_status"] == 408
        invites = [data for data in silent.received if data.startswith(b"INVITE ")]
        assert len(invites) >= 4 and len(set(invites)) == 1  # the same request, resent
    finally:
        transport.close()
    await until_idle(server)


@pytest.mark.slow
async def test_trunk_file_mistakes_stop_the_server(tmp_path: Path) -> None:
    path = tmp_path / "trunks.json"
    path.write_text('{"t1": {"proxy": "sip:127.0.0.1", "username": "u", "password": '
                    '"s3cret", "colour": "red"}}')
    code, err = await run_server("--sip-listen", f"{HOST}:{free_udp_port()}",
                                 "--sip-trunks", str(path))
    assert code == 2 and "error [sip_config_invalid]" in err and "colour" in err
    assert "s3cret" not in err and "Traceback" not in err
    code, err = await run_server("--sip-trunks", str(path))
    assert code == 2 and "needs --sip-listen" in err and "Traceback" not in err


@pytest.mark.slow
async def test_two_workers_place_and_end_a_call(tmp_path: Path) -> None:
    """`python -m signaling --workers 2`: whichever worker takes the POST, the call is placed
    by worker 0 (the SIP one), and its id routes GET, refer and hang-up there."""
    uas, port = await sipp_uas(tmp_path, uas_scenarios.answer_then_hangup_from_agent(),
                               "-mp", str(free_udp_port()), timeout=40)
    trunks = tmp_path / "trunks.json"
    trunks.write_text(json.dumps({"t1": {"proxy": f"sip:{HOST}:{port}", "username": "u",
                                         "password": "p"}}))
    async with running_server("--workers", "2", "--sip-listen", f"{HOST}:{free_udp_port()}",
                              "--sip-trunks", str(trunks),
                              ready="serving plugin echo on") as (server, url, lines):
        async with aiohttp.ClientSession() as http:
            refusals = []
            for _ in range(4):  # spread over both workers: every one is worker 0's 400
                async with http.post(f"{url}/v1/sip/calls",
                                     json={"to": "sip:x@example.com", "trunk": "t2"}) as r:
                    refusals.append((r.status, (await r.json())["error"]["code"]))
            assert refusals == [(400, "unknown_trunk")] * 4
            async with http.post(f"{url}/v1/sip/calls",
                                 json={"to": "sip:bob@example.com", "trunk": "t1"}) as r:
                assert r.status == 201, await r.text()
                call_id = (await r.json())["id"]
            for _ in range(200):
                async with http.get(f"{url}/v1/sip/calls/{call_id}") as r:
                    status = (await r.json())["status"]
                if status != "calling" and status != "ringing":
                    break
                await asyncio.sleep(0.05)
            assert status == "answered"
            async with http.post(f"{url}/v1/realtime/calls/{call_id}/refer",
                                 json={"target_uri": "mailto:x"}) as r:
                assert (await r.json())["error"]["code"] == "invalid_target"
            async with http.post(f"{url}/v1/realtime/calls/{call_id}/hangup") as r:
                assert r.status == 200
        run = await uas
        assert run.returncode == 0, run.explain() + "".join(lines)
        server.terminate()
        assert await server.wait() == 0
        assert "Traceback" not in "".join(lines)


# -- one resource for every call: /v1/realtime/calls/{id} ----------------------------------


async def realtime_call(server: SipServer, call_id: str, method: str = "GET",
                        suffix: str = "") -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.request(
            method, f"{server.url}/v1/realtime/calls/{call_id}{suffix}") as response:
        return response.status, dict(await response.json())


async def test_a_ringing_call_is_a_realtime_call_and_delete_cancels_it(
        dialing: SipServer, tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.ring_until_cancelled())
    code, body, _ = await place(dialing, {"to": sip_to(port)})
    await wait_status(dialing, body["id"], "ringing")
    status, call = await realtime_call(dialing, body["id"])
    assert status == 200, call
    assert call["object"] == "realtime.call" and call["transport"] == "sip"
    assert (call["status"], call["state"], call["direction"]) == ("ringing", "ringing",
                                                                 "outbound")
    assert call["remote_party"] == f"<{sip_to(port)}>" and call["sip_status"] is None
    assert "stats" not in call  # no leg yet
    status, ended = await realtime_call(dialing, body["id"], "DELETE")
    assert status == 200 and ended["status"] == "ended"
    call = await wait_status(dialing, body["id"], "ended")
    assert call["reason"] == "hangup" and call["sip_status"] == 487
    run = await uas
    assert run.returncode == 0, run.explain()
    assert run.count("CANCEL", "received") == 1
    status, after = await realtime_call(dialing, body["id"])  # kept readable, with its end
    assert status == 200 and (after["status"], after["reason"]) == ("ended", "hangup")
    assert (await realtime_call(dialing, body["id"], "POST", "/hangup"))[0] == 404
    await until_idle(dialing)


async def test_an_answered_outbound_call_and_its_hangup_route(dialing: SipServer,
                                                              tmp_path: Path) -> None:
    uas, _, call_id = await answered_call(dialing, tmp_path)
    status, call = await realtime_call(dialing, call_id)
    assert status == 200, call
    assert (call["status"], call["transport"], call["state"]) == ("active", "sip", "answered")
    assert call["sip_status"] == 200 and call["direction"] == "outbound"
    assert "SIPpTag01" in call["remote_party"] and call["stats"]["codec"] == "PCMU"
    status, _ = await realtime_call(dialing, call_id, "POST", "/hangup")
    assert status == 200
    assert (await wait_status(dialing, call_id, "ended"))["reason"] == "hangup"
    assert (await uas).returncode == 0
    await until_idle(dialing)


async def test_inbound_sip_calls_rtp_and_media_stream_legs_are_realtime_calls(
        dialing: SipServer) -> None:
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    try:
        dialogue, _, _ = await establish(dialing, peer, sdp_offer(probe.port))
        (leg,) = list(dialing.agent.legs)
        status, call = await realtime_call(dialing, leg.id)
        assert status == 200, call
        assert (call["status"], call["transport"], call["direction"]) == ("active", "sip",
                                                                          "inbound")
        assert call["state"] == "answered" and call["sip_status"] == 200
        assert call["remote_party"].startswith(f"<sip:caller@{HOST}:{peer.port}>")
        assert call["sip_call_id"] == dialogue.call_id
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{dialing.url}/v1/telephony/rtp",
                                 json={"codec": "PCMU"}) as response:
                assert response.status == 201
                rtp_id = (await response.json())["call_id"]
        status, rtp = await realtime_call(dialing, rtp_id)
        assert status == 200 and (rtp["transport"], rtp["status"]) == ("rtp", "active")
        assert "direction" not in rtp and rtp["stats"]["codec"] == "PCMU"
        assert (await realtime_call(dialing, rtp_id, "DELETE"))[0] == 200
        async with aiohttp.ClientSession() as http, http.ws_connect(
                f"{dialing.url}/v1/telephony/media-stream"):
            await wait_until(lambda: any(leg.transport == "media-stream"
                                         for leg in dialing.agent.legs))
            (stream,) = [leg for leg in dialing.agent.legs if leg.transport == "media-stream"]
            status, body = await realtime_call(dialing, stream.id)
            assert status == 200 and (body["transport"], body["status"]) == ("media-stream",
                                                                             "active")
            assert body["stats"]["call_id"] == stream.id
        status, _ = await realtime_call(dialing, leg.id, "DELETE")  # a BYE to the caller
        assert status == 200
        bye = await peer.request("BYE")
        peer.send(SipResponse(headers=bye.headers, status=200, reason="OK"), dialing.sip)
        assert (await realtime_call(dialing, "sip_unknown"))[0] == 404
    finally:
        peer.close()
        probe.close()
    await until_idle(dialing)


# -- the far end's offers, spoofed requests, early media --------------------------------------

KEEP_PARTIES = "\n".join([
    '<recv request="INVITE"><action>',
    '  <ereg regexp=".*" search_in="hdr" header="From:" assign_to="from_party"/>',
    '  <ereg regexp=".*" search_in="hdr" header="To:" assign_to="to_party"/>',
    '  <ereg regexp="sip:[^>]*" search_in="hdr" header="Contact:" assign_to="agent_contact"/>',
    '</action></recv>'])


def far_end_request(method: str, cseq: int, direction: str | None = None) -> str:
    """A request of sipp (the callee) in the dialog, with an offer in `direction`."""
    body = (uas_scenarios.ANSWER_SDP.replace("a=sendrecv", f"a={direction}")
            .replace("o=sipp 1 1", f"o=sipp 1 {cseq + 1}") if direction else "")
    content = (f"Content-Type: application/sdp\nContent-Length: [len]\n\n{body}" if body
               else "Content-Length: 0\n")
    retrans = ' retrans="500"' if method != "ACK" else ""
    return (f"<send{retrans}><![CDATA[\n{method} [$agent_contact] SIP/2.0\n"
            "Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]\n"
            "From: [$to_party];tag=[pid]SIPpTag01[call_number]\nTo: [$from_party]\n"
            f"[last_Call-ID:]\nCSeq: {cseq} {method}\n"
            "Contact: <sip:sipp@[local_ip]:[local_port];transport=[transport]>\n"
            f"Max-Forwards: 70\n{content}\n]]></send>")


def expect_answer(direction: str, var: str) -> str:
    """The agent's 200 must answer in `direction` (sipp fails the call otherwise)."""
    return (f'<recv response="200"><action><ereg regexp="a={direction}" search_in="body" '
            f'check_it="true" assign_to="{var}"/></action></recv>')


def hold_resume_from_far_end() -> str:
    """Answer; then re-INVITE on hold (sendonly), re-INVITE back (sendrecv), UPDATE to
    inactive, each answer checked; an offerless re-INVITE answered sendonly in the ACK; a
    REFER (405); then take the agent's BYE."""
    return uas_scenarios.scenario("far-end-hold", "\n".join([
        KEEP_PARTIES, uas_scenarios.reply("200 OK", uas_scenarios.ANSWER_SDP, True),
        '<recv request="ACK"/>', '<pause milliseconds="200"/>',
        far_end_request("INVITE", 1, "sendonly"), '<recv response="100" optional="true"/>',
        expect_answer("recvonly", "held"), far_end_request("ACK", 1),
        '<pause milliseconds="200"/>',
        far_end_request("INVITE", 2, "sendrecv"), '<recv response="100" optional="true"/>',
        expect_answer("sendrecv", "resumed"), far_end_request("ACK", 2),
        far_end_request("UPDATE", 3, "inactive"), expect_answer("inactive", "inactive"),
        # An offerless re-INVITE: the agent offers (its codec only), the answer is the ACK's.
        far_end_request("INVITE", 4), '<recv response="100" optional="true"/>',
        '<recv response="200"><action><ereg regexp="m=audio [0-9]+ RTP/AVP 0 101" '
        'search_in="body" check_it="true" assign_to="offered"/></action></recv>',
        far_end_request("ACK", 4, "sendonly"),
        # A transfer asked of the agent: not served (405 with Allow).
        far_end_request("REFER", 5).replace("Max-Forwards: 70\n",
                                             "Max-Forwards: 70\nRefer-To: <sip:x@[local_ip]>\n"),
        '<recv response="405"/>',
        '<recv request="BYE" timeout="20000"/>',
        "<send><![CDATA[\nSIP/2.0 200 OK\n[last_Via:]\n[last_From:]\n[last_To:]\n"
        "[last_Call-ID:]\n[last_CSeq:]\nX-Seen: [$held] [$resumed] [$inactive] [$offered]\n"
        "Content-Length: 0\n\n]]></send>"]))


async def test_the_far_end_holds_and_resumes_an_outbound_call(dialing: SipServer,
                                                              tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, hold_resume_from_far_end(),
                               "-mp", str(free_udp_port()))
    _, body, _ = await place(dialing, {"to": sip_to(port)})
    await wait_status(dialing, body["id"], "answered")
    leg = dialing.agent.legs.get(body["id"])
    assert leg is not None
    directions: list[str] = []
    for _ in range(200):
        call = await get_call(dialing, body["id"])
        directions = [e["direction"] for e in call["events"]
                      if e["type"] == "call.media_updated"]
        if len(directions) == 4:
            break
        await asyncio.sleep(0.05)
    assert directions == ["recvonly", "sendrecv", "inactive", "recvonly"], call["events"]
    assert leg.stats()["direction"] == "recvonly" and not leg.agent_sends  # type: ignore[attr-defined]
    dialer = dialing.server.app[SIP_SERVICE_KEY].dialer
    assert dialer is not None
    assert (dialer.counters["reinvites"], dialer.counters["updates"]) == (3, 1)
    assert dialing.ua.counters["stray_acks"] == 0  # both ACKs reached the call
    async with aiohttp.ClientSession() as http, http.delete(
            f"{dialing.url}/v1/sip/calls/{body['id']}") as response:
        assert response.status == 200
    run = await uas
    assert run.returncode == 0, run.explain()  # every answer had the direction sipp checked
    assert "X-Seen: a=recvonly a=sendrecv a=inactive m=audio" in run.messages
    assert run.count("REFER", "sent") == 1
    await until_idle(dialing)


async def test_a_spoofed_bye_for_an_outbound_call_gets_403(dialing: SipServer,
                                                           tmp_path: Path) -> None:
    uas, port, call_id = await answered_call(dialing, tmp_path)
    dialer = dialing.server.app[SIP_SERVICE_KEY].dialer
    assert dialer is not None
    dialog = dialer.live[call_id].dialog
    assert dialog is not None
    spoofer = await peer_at("127.0.0.2")  # not the callee's (or a proxy's) address
    try:
        bye = Headers()
        bye.add("Via", f"SIP/2.0/UDP 127.0.0.2:{spoofer.port};branch=z9hG4bKspoof1")
        bye.add("From", f"<{sip_to(port)}>;tag={dialog.remote_tag}")
        bye.add("To", f"<sip:agent@{HOST}>;tag={dialog.local_tag}")
        bye.add("Call-ID", dialog.call_id)
        bye.add("CSeq", "9 BYE")
        bye.add("Max-Forwards", "70")
        spoofer.send(SipRequest(headers=bye, method="BYE", uri=f"sip:agent@{HOST}"),
                     dialing.sip)
        await spoofer.response(403)
    finally:
        spoofer.close()
    assert dialing.ua.counters["spoofed_in_dialog"] == 1
    assert (await get_call(dialing, call_id))["status"] == "answered"  # it goes on
    async with aiohttp.ClientSession() as http, http.delete(
            f"{dialing.url}/v1/sip/calls/{call_id}") as response:
        assert response.status == 200
    assert (await wait_status(dialing, call_id, "ended"))["reason"] == "hangup"
    assert (await uas).returncode == 0
    await until_idle(dialing)


def early_media_then_answer(wav: str) -> str:
    """183 with SDP, an announcement streamed as early media, then the answer."""
    return uas_scenarios.scenario("early-media", "\n".join([
        '<recv request="INVITE"/>', uas_scenarios.reply("180 Ringing"),
        uas_scenarios.reply("183 Session Progress", uas_scenarios.ANSWER_SDP),
        f'<nop><action><exec rtp_stream="{wav},1,0"/></action></nop>',
        '<pause milliseconds="2500"/>',
        uas_scenarios.reply("200 OK", uas_scenarios.ANSWER_SDP, True),
        '<recv request="ACK"/>', '<recv request="BYE" timeout="20000"/>',
        uas_scenarios.reply("200 OK", tag=False)]))


async def test_early_media_opens_the_leg_before_the_answer(dialing: SipServer,
                                                           tmp_path: Path) -> None:
    write_mulaw_wav(tmp_path / "ring.wav", make_test_signal(1.0, 8000))
    uas, port = await sipp_uas(tmp_path, early_media_then_answer("ring.wav"),
                               "-mp", str(free_udp_port()))
    _, body, _ = await place(dialing, {"to": sip_to(port)})
    heard_early = False
    for _ in range(100):  # while it rings, the leg takes the announcement in
        call = await get_call(dialing, body["id"])
        leg = dialing.agent.legs.get(body["id"])
        if call["status"] in ("answered", "ended"):
            break
        if leg is not None and leg.stats()["remote_source"]:
            heard_early = True
            assert leg.stats()["packets_sent"] == 0  # the agent listens only
            break
        await asyncio.sleep(0.05)
    assert heard_early, call
    assert [e["type"] for e in call["events"]][:2] == ["call.ringing", "call.early_media"]
    status, resource = await realtime_call(dialing, body["id"])
    assert status == 200 and resource["status"] == "active" and resource["state"] == "ringing"
    await wait_status(dialing, body["id"], "answered")
    leg = dialing.agent.legs.get(body["id"])
    assert leg is not None
    for _ in range(100):  # answered: now the agent sends
        if leg.stats()["packets_sent"] > 5:
            break
        await asyncio.sleep(0.05)
    assert leg.stats()["packets_sent"] > 5
    async with aiohttp.ClientSession() as http, http.delete(
            f"{dialing.url}/v1/sip/calls/{body['id']}") as response:
        assert response.status == 200
    assert (await uas).returncode == 0
    await until_idle(dialing)


async def test_a_ringing_inbound_call_is_a_realtime_call_and_delete_declines_it(
        start_sip: SipServerFactory, receiver_factory: Any) -> None:  # noqa: F811
    receiver = await receiver_factory()
    server = await webhook_server(start_sip, receiver)
    peer, probe = await SipPeer.open(), await RtpProbe.open()
    try:
        dialogue = Dialogue(peer.port, server.sip)
        peer.send(dialogue.request("INVITE", body=sdp_offer(probe.port)), server.sip)
        event = await asyncio.wait_for(receiver.events.get(), 10)
        call_id = event["data"]["call_id"]
        status, call = await realtime_call(server, call_id)
        assert status == 200, call
        assert (call["status"], call["state"], call["direction"]) == ("ringing", "ringing",
                                                                     "inbound")
        assert call["pending"] is True and call["sip_status"] is None
        assert call["remote_party"].startswith(f"<sip:caller@{HOST}:{peer.port}>")
        status, _ = await realtime_call(server, call_id, "DELETE")
        assert status == 200
        declined = await peer.response(603)
        peer.send(dialogue.ack_for(dialogue.request("INVITE"), declined), server.sip)
        assert (await realtime_call(server, call_id))[0] == 404  # inbound calls end there
    finally:
        peer.close()
        probe.close()
    await wait_until(server.quiet)
