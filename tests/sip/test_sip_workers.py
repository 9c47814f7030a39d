"""SIP with `--workers 2`: worker 0 serves SIP, and the controls of its calls
(`/accept`, `/reject`, `/dtmf`, `/hangup`) work whichever worker a request lands on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sip.helpers import HOST, Dialogue, RtpProbe, SipPeer, free_udp_port, sdp_offer
from tests.sip.test_sip_ua import reply_to
from tests.workers.test_workers import two_workers, wait_for_async


@pytest.mark.slow
async def test_controls_of_a_sip_call_reach_worker_0_from_worker_1(tmp_path: Path) -> None:
    sip_port = free_udp_port()
    async with two_workers(tmp_path / "workers", "--sip-listen", f"{HOST}:{sip_port}") as group:
        peer, probe = await SipPeer.open(), await RtpProbe.open()
        dialogue = Dialogue(peer.port, (HOST, sip_port))
        invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
        peer.send(invite, (HOST, sip_port))
        ok = await peer.response(200, timeout=10)
        peer.send(dialogue.ack_for(invite, ok), (HOST, sip_port))
        async with group.via(1).get("http://worker/metrics/calls") as response:
            calls = (await response.json())["calls"]
        (call_id,) = [call["call_id"] for call in calls]
        base = f"http://worker/v1/realtime/calls/{call_id}"
        # Each from worker 1, which does not hold the call: forwarded to worker 0.
        async with group.via(1).post(base + "/dtmf", json={"digits": "1#"}) as response:
            assert response.status == 200, await response.text()
        async with group.via(1).post(base + "/accept", json={}) as response:
            # Answered already: the owner's own refusal, not worker 1's 404.
            body = await response.json()
            assert response.status != 404, body
            assert body["error"]["code"] != "call_not_found", body
        async with group.via(1).post(base + "/hangup") as response:
            assert response.status == 200, await response.text()
        bye = await peer.request("BYE", timeout=10)
        peer.send(reply_to(bye, 200), (HOST, sip_port))

        async def ended() -> bool:
            return (await group.health())["active_calls"] == 0

        await wait_for_async(ended, 10)
        peer.close()
        probe.close()
