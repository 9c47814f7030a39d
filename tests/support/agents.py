"""Real agent servers on 127.0.0.1 for tests, ICE kept on loopback.

A fixture module (registered in tests/conftest.py): `start_agent`, `echo_agent` and the
session-wide `loopback_ice`; and the types and waits tests import from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import Plugin
from agent.plugins.echo import EchoPlugin
from agent.rtc_tuning import limit_host_addresses
from signaling.app import create_app


@dataclass
class RunningAgent:
    agent: MediaAgent
    server: TestServer

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


AgentFactory = Callable[..., Awaitable[RunningAgent]]


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.05)


def all_freed(running: RunningAgent) -> bool:
    return not running.agent.webrtc_legs and not running.agent.ticker.slots


@pytest.fixture(autouse=True, scope="session")
def loopback_ice() -> None:
    # aioice never offers loopback by itself; tests must stay on 127.0.0.1.
    limit_host_addresses(["127.0.0.1"])


@pytest.fixture
async def start_agent() -> AsyncIterator[AgentFactory]:
    """Start a real agent server; every one started is shut down after the test."""
    running: list[RunningAgent] = []

    async def start(plugin: Plugin | None = None, settings: AgentSettings | None = None,
                    **app_options: object) -> RunningAgent:
        agent = MediaAgent(plugin or EchoPlugin(), settings or AgentSettings())
        server = TestServer(create_app(agent, **app_options), host="127.0.0.1")
        await server.start_server()
        instance = RunningAgent(agent, server)
        running.append(instance)
        return instance

    yield start
    for instance in running:
        await instance.server.close()


@pytest.fixture
async def echo_agent(start_agent: AgentFactory) -> RunningAgent:
    return await start_agent()
