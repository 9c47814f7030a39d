"""Fixtures: fake engines on 127.0.0.1, closed after each test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.support.fake_engines import Behaviour, FakeMoshi, FakeServer, FakeVllmOmni

StartFake = Callable[..., Awaitable[FakeServer]]


@pytest.fixture
async def start_fake() -> AsyncIterator[Callable[..., Awaitable[FakeServer]]]:
    started: list[FakeServer] = []

    async def start(kind: str, behaviour: Behaviour | None = None) -> FakeServer:
        server_class = {"vllm": FakeVllmOmni, "moshi": FakeMoshi}[kind]
        server = await server_class(behaviour).start()
        started.append(server)
        return server

    yield start
    for server in started:
        await server.kill()  # a test that failed midway may leave sockets open
