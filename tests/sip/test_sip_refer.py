"""Transfer (signaling/sip/refer.py): REFER to a sipp far end that accepts it (202) and
reports the new call's 200 in a NOTIFY sipfrag; the agent's side then ends `transferred`.
And the refusals: bad targets, non-SIP calls, sipfrag parsing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from agent.errors import AgentError
from agent.leg import Leg
from signaling.sip.refer import parse_target, sipfrag_status
from tests.sip import scenarios, uas_scenarios
from tests.sip.helpers import SippRun, SipServer, SipServerFactory, free_udp_port, run_sipp
from tests.sip.outbound_helpers import (
    dialing_server,
    place,
    sip_to,
    sipp_uas,
    until_idle,
    wait_status,
)


@pytest.fixture
async def dialing(start_sip: SipServerFactory) -> SipServer:
    return await dialing_server(start_sip)


@pytest.mark.interop
async def test_refer_accepted_ends_the_call_transferred(dialing: SipServer,
                                                        tmp_path: Path) -> None:
    uas, port = await sipp_uas(tmp_path, uas_scenarios.accept_transfer(),
                               "-mp", str(free_udp_port()), "-rtp_echo")
    code, body, _ = await place(dialing, {"to": sip_to(port)})
    assert code == 201, body
    call_id = body["id"]
    await wait_status(dialing, call_id, "answered")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{dialing.url}/v1/realtime/calls/{call_id}/refer",
                             json={"target_uri": "tel:+14155550123"}) as response:
            answer = await response.json()
            assert response.status == 202, answer
            assert answer["object"] == "realtime.call.refer" and answer["sip_status"] == 202
    call = await wait_status(dialing, call_id, "ended")
    assert call["reason"] == "transferred"
    run = await uas
    assert run.returncode == 0, run.explain()
    assert "Refer-To: <tel:+14155550123>" in run.messages
    assert "Referred-By: <sip:agent@" in run.messages
    await until_idle(dialing)


@pytest.mark.parametrize("target", ["", "http://x", "tel:abc", "sip:", "sip:a@b\r\nX: y",
                                    "tel:+1" + "5" * 600, 5, None])
def test_bad_targets(target: object) -> None:
    with pytest.raises(AgentError) as caught:
        parse_target(target)
    assert caught.value.code == "invalid_target" and caught.value.status == 400


def test_good_targets() -> None:
    assert str(parse_target("tel:+1-415-555-0123")) == "tel:+1-415-555-0123"
    assert parse_target("sip:desk@pbx.example.com;transport=tcp").host == "pbx.example.com"


def test_sipfrag_status() -> None:
    assert sipfrag_status(b"SIP/2.0 200 OK\r\n") == 200
    assert sipfrag_status(b"SIP/2.0 180 Ringing") == 180
    assert sipfrag_status(b"SIP/2.0 603 Declined\r\nX: y\r\n") == 603
    assert sipfrag_status(b"HTTP/1.1 200 OK") is None
    assert sipfrag_status(b"") is None
    assert sipfrag_status(b"\xff\xfe") is None


async def test_refer_on_a_non_sip_call_is_409(dialing: SipServer) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{dialing.url}/v1/telephony/rtp",
                             json={"codec": "PCMU"}) as response:
            created = await response.json()
            assert response.status in (200, 201), created
        leg_id = created["call_id"]
        async with http.post(f"{dialing.url}/v1/realtime/calls/{leg_id}/refer",
                             json={"target_uri": "tel:+1555"}) as response:
            answer = await response.json()
            assert response.status == 409 and answer["error"]["code"] == "not_a_sip_call"
        async with http.post(f"{dialing.url}/v1/realtime/calls/{leg_id}/refer",
                             json={"target_uri": "mailto:x"}) as response:
            assert (await response.json())["error"]["code"] == "invalid_target"
        async with http.delete(f"{dialing.url}/v1/realtime/calls/{leg_id}") as response:
            assert response.status == 200


def inbound_call_transferred(sipfrag: str) -> str:
    """sipp calls the agent, accepts the agent's REFER (202) and reports `sipfrag` in a
    NOTIFY; a 2xx is then followed by the agent's BYE, anything else by sipp's own."""
    notify = f"""  <send retrans="500">
    <![CDATA[
      NOTIFY [next_url] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      [routes]
      {scenarios.FROM}
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 NOTIFY
      {scenarios.CONTACT}
      Max-Forwards: 70
      Event: refer
      Subscription-State: terminated;reason=noresource
      Content-Type: message/sipfrag;version=2.0
      Content-Length: [len]

{sipfrag}
    ]]>
  </send>
  <recv response="200"/>
"""
    accepted = scenarios.reply("202 Accepted")
    if sipfrag.startswith("SIP/2.0 2"):
        ending = ('  <recv request="BYE" timeout="15000"/>\n'
                  + scenarios.reply("200 OK"))
    else:
        ending = '  <pause milliseconds="300"/>\n' + scenarios.hang_up(3)
    return scenarios.scenario("inbound transfer", scenarios.establish("[media_port]")
                              + '  <recv request="REFER" timeout="15000"/>\n' + accepted
                              + notify + ending)


async def refer_the_inbound_call(server: SipServer, tmp_path: Path,
                                 sipfrag: str) -> tuple[SippRun, Leg]:
    uac = asyncio.ensure_future(run_sipp(server.sip, tmp_path, "-m", "1",
                                         scenario=inbound_call_transferred(sipfrag),
                                         timeout=20))
    leg: Leg | None = None
    for _ in range(200):
        legs = [leg for leg in server.agent.legs if leg.transport == "sip"]
        call = server.ua.find_call(legs[0].id) if legs else None
        if call is not None and call.state == "confirmed":
            leg = legs[0]
            break
        await asyncio.sleep(0.05)
    assert leg is not None, "the inbound call was never confirmed"
    call_id = leg.id
    async with aiohttp.ClientSession() as http, http.post(
            f"{server.url}/v1/realtime/calls/{call_id}/refer",
            json={"target_uri": "sip:desk@pbx.example.com"}) as response:
        assert response.status == 202, await response.text()
    run = await uac
    assert run.returncode == 0, run.explain()
    assert "Refer-To: <sip:desk@pbx.example.com>" in run.messages
    return run, leg


@pytest.mark.interop
async def test_refer_on_an_inbound_call(sip_server: SipServer, tmp_path: Path) -> None:
    run, leg = await refer_the_inbound_call(sip_server, tmp_path, "SIP/2.0 200 OK")
    assert 'text="transferred"' in run.messages  # the BYE's Reason
    assert leg.end_reason == "transferred"
    assert [e["type"] for e in leg.events if str(e["type"]).startswith("call.transfer")] == [
        "call.transfer.accepted", "call.transfer.completed"]
    for _ in range(100):
        if sip_server.quiet():
            break
        await asyncio.sleep(0.05)
    assert sip_server.quiet() and not len(sip_server.ua.dialog_hooks)


@pytest.mark.interop
async def test_failed_transfer_keeps_the_call(sip_server: SipServer, tmp_path: Path) -> None:
    run, leg = await refer_the_inbound_call(sip_server, tmp_path, "SIP/2.0 486 Busy Here")
    # The call went on after the failed transfer: sipp hung up itself, and got its 200.
    assert run.count("BYE", "sent") == 1 and run.count("BYE", "received") == 0
    assert leg.end_reason == "remote_hangup"
    failed = [e for e in leg.events if e["type"] == "call.transfer.failed"]
    assert failed and failed[0]["sip_status"] == 486 and failed[0]["code"] == "transfer_failed"
