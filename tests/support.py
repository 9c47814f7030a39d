"""Types shared by tests (importable as `support`, since pytest puts tests/ on sys.path)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp.test_utils import TestServer

from agent.media_agent import MediaAgent


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
