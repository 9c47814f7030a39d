"""The call routes ask a leg what it can do (`Leg.can`, agent/leg.py), never its class: a
transport the routes have never heard of gets DTMF, its session in `GET` and an ICE
generation in its ETag by saying so, and one that says nothing is refused as before."""

from __future__ import annotations

from typing import Any

import aiohttp

from agent.leg import Leg, LegCapabilities
from signaling.auth import OPEN
from signaling.calls import RESOURCES_KEY, etag_of
from tests.support.agents import AgentFactory, RunningAgent


class PagerLeg(Leg):
    """A transport no route names: it keeps what it is asked to do."""

    transport = "pager"
    can = LegCapabilities(realtime_session=True, dtmf=True, ice_restart=True)

    def __init__(self, running: RunningAgent, leg_id: str) -> None:
        agent = running.agent
        super().__init__(leg_id, agent.plugin, agent.ticker, agent.settings.call,
                         agent.legs.discard)
        self.digits = ""

    def send_dtmf(self, digits: str) -> int:
        self.digits += digits
        return len(self.digits)

    def describe_session(self) -> dict[str, Any]:
        return {"object": "realtime.session", "pager": True}

    @property
    def ice_generation(self) -> int:
        return 2


class MuteLeg(Leg):
    """A transport that can do none of it."""

    transport = "mute"


def add(running: RunningAgent, leg: Leg) -> None:
    running.agent.legs.add(leg)
    running.server.app[RESOURCES_KEY].add(leg.id, OPEN)


async def test_a_new_transport_is_served_by_what_it_can_do(start_agent: AgentFactory
                                                           ) -> None:
    running = await start_agent()
    leg = PagerLeg(running, "pager_1")
    add(running, leg)
    url = f"{running.url}/v1/realtime/calls/{leg.id}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/dtmf", json={"digits": "12#"}) as reply:
            assert reply.status == 200, await reply.text()
            assert (await reply.json())["queued"] == 3
        assert leg.digits == "12#"
        async with http.get(url) as reply:
            body = await reply.json()
            assert body["transport"] == "pager"
            assert body["session"] == {"object": "realtime.session", "pager": True}
            assert reply.headers["ETag"] == etag_of(leg.id, 2)
    await leg.close()


async def test_a_transport_that_can_do_nothing_is_refused(start_agent: AgentFactory) -> None:
    running = await start_agent()
    leg = MuteLeg("mute_1", running.agent.plugin, running.agent.ticker,
                  running.agent.settings.call, running.agent.legs.discard)
    add(running, leg)
    url = f"{running.url}/v1/realtime/calls/{leg.id}"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/dtmf", json={"digits": "1"}) as reply:
            assert reply.status == 409
            assert (await reply.json())["error"]["code"] == "dtmf_not_negotiated"
        async with http.get(url) as reply:
            body = await reply.json()
            assert "session" not in body and reply.headers["ETag"] == etag_of(leg.id)
    await leg.close()
