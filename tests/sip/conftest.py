"""Fixtures of the SIP tests: the agent with its SIP user agent on 127.0.0.1, a free port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer

from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.base import Plugin
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.sip.config import SipConfig
from signaling.sip.service import install
from signaling.telephony import TelephonyConfig
from tests.sip.helpers import SipServer, SipServerFactory


@pytest.fixture
async def start_sip() -> AsyncIterator[SipServerFactory]:
    """Start agents serving SIP on 127.0.0.1 (a free port); all stopped after the test."""
    running: list[SipServer] = []

    async def start(plugin: Plugin | None = None, settings: AgentSettings | None = None,
                    config: SipConfig | None = None,
                    telephony: TelephonyConfig | None = None, **app_options: object) -> SipServer:
        agent = MediaAgent(plugin or EchoPlugin(), settings or AgentSettings())
        app = create_app(agent, telephony_config=telephony, **app_options)  # type: ignore[arg-type]
        service = install(app, config or SipConfig(listen_port=0))
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        assert service.ua is not None
        instance = SipServer(agent, server, service.ua)
        running.append(instance)
        return instance

    yield start
    for instance in running:
        await instance.server.close()


@pytest.fixture
async def sip_server(start_sip: SipServerFactory) -> SipServer:
    return await start_sip()
