"""One object per running event loop (per_loop.py)."""

from __future__ import annotations

import asyncio

import pytest

from agent.testing.peer.transports.per_loop import PerLoop


def test_each_loop_gets_its_own_made_once() -> None:
    made: list[object] = []
    one = PerLoop(lambda: made.append(object()) or made[-1])

    async def twice() -> tuple[object, object]:
        return one(), one()

    first, again = asyncio.run(twice())
    other, _ = asyncio.run(twice())
    assert first is again and other is not first and len(made) == 2


def test_outside_a_loop_there_is_none() -> None:
    with pytest.raises(RuntimeError):
        PerLoop(object)()
