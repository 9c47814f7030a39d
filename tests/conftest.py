"""Shared fixtures: real agent servers on 127.0.0.1, ICE kept on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import Plugin
from agent.plugins.echo import EchoPlugin
from agent.rtc_tuning import limit_host_addresses
from signaling.app import create_app
from support import AgentFactory, RunningAgent


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
