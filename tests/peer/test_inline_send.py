"""A send coroutine run in place: finished at once, held while it waits on a future and
resumed once that is done, its failure kept as data, abandoned on close."""

from __future__ import annotations

import asyncio

import pytest

from agent.testing.peer.transports.inline_send import InlineSend


async def test_a_send_that_does_not_wait_finishes_in_place() -> None:
    done: list[str] = []

    async def send() -> None:
        done.append("sent")

    sender = InlineSend()
    assert sender.run(send()) and done == ["sent"]
    assert sender.ready() and sender.error is None and sender.waits == 0


async def test_a_send_that_waits_is_held_and_resumed_once_its_future_is_done() -> None:
    drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    steps: list[str] = []

    async def send() -> None:
        steps.append("written")
        await drained  # aiohttp's writer waiting for the transport to drain
        steps.append("drained")

    sender = InlineSend()
    assert not sender.run(send())
    assert steps == ["written"] and sender.waits == 1
    assert not sender.ready() and not sender.ready()  # still waiting: not resumed
    with pytest.raises(RuntimeError):
        sender.run(send())  # one send at a time
    drained.set_result(None)
    assert sender.ready() and steps == ["written", "drained"] and sender.error is None


async def test_a_failing_send_leaves_its_error() -> None:
    async def send() -> None:
        raise ConnectionResetError("closing transport")

    sender = InlineSend()
    assert sender.run(send())
    assert isinstance(sender.error, ConnectionResetError) and sender.ready()


async def test_a_wait_that_is_cancelled_is_an_error_not_a_cancelled_caller() -> None:
    drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def send() -> None:
        await drained

    sender = InlineSend()
    assert not sender.run(send())
    drained.cancel()  # the connection was lost while the send waited
    assert sender.ready() and isinstance(sender.error, asyncio.CancelledError)


async def test_close_abandons_a_waiting_send() -> None:
    drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cleaned: list[bool] = []

    async def send() -> None:
        try:
            await drained
        finally:
            cleaned.append(True)

    sender = InlineSend()
    assert not sender.run(send())
    sender.close()
    assert cleaned == [True] and sender.ready()
    sender.close()  # idempotent
