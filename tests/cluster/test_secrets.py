"""Ephemeral secrets shared by the cluster (signaling/cluster/secrets.py) as one worker of a
node handles a new call made with one: a real redis-server, a real app served on loopback,
the node's own request path (routing.handle_here). The handler after it answers as the
worker routing does for a call another worker makes: that worker's answer, relayed.

A worker that redeems a secret in Redis adopts a copy; the copy must go unless a call made
in this worker holds it, or it counts as one of the key's unused secrets (for every worker,
through the shared tally) until it expires, and the key's next mints are refused 429.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agent.errors import AgentError
from agent.media_agent import AgentSettings, MediaAgent
from agent.plugins.echo import EchoPlugin
from signaling.app import create_app
from signaling.auth import SECRET_PREFIX, SECRETS_KEY, AuthSettings, SecretStore
from signaling.cluster import routing
from signaling.cluster.node import ClusterNode
from signaling.cluster.secrets import secret_hash
from signaling.cluster.settings import ClusterSettings
from signaling.errors import ApiError, error_response
from signaling.workers.tally import SharedTally, key_of
from tests.cluster.support import Redis

KEY = "key-secrets-01"
Relayed = Callable[[web.Request], Awaitable[web.StreamResponse]]


def relayed(status: int) -> Relayed:
    """What the worker routing answers for a new call it passed to the worker that minted
    the secret: that worker's answer (a call it made, or its refusal)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if status == 201:
            call = "rtc_" + secrets.token_urlsafe(18)
            return web.json_response({"id": call}, status=201,
                                     headers={"Location": f"/v1/realtime/calls/{call}"})
        return web.json_response({"error": {"code": "server_full", "message": "full"}},
                                 status=status)
    return handler


class Worker:
    def __init__(self, node: ClusterNode, store: SecretStore, url: str) -> None:
        self.node, self.store, self.url = node, store, url
        self.answer: Relayed = relayed(201)

    async def mint_in_redis(self) -> str:
        """A secret another worker minted and published (scripts.MINT)."""
        value = SECRET_PREFIX + secrets.token_urlsafe(24)
        answer = await self.node.store.run(
            "MINT", hash=secret_hash(value), tenant="t", limit=3,
            expires=int((time.time() + 60) * 1000), session="{}")
        assert answer[0] == "minted"
        return value

    async def state(self, value: str) -> str:
        return str((await self.node.store.run("SECRET", op="peek",
                                              hash=secret_hash(value)))[0])


@pytest.fixture
async def worker(redis: Redis) -> AsyncIterator[Worker]:
    agent = MediaAgent(EchoPlugin(), AgentSettings())
    app = create_app(agent, auth=AuthSettings(api_keys=(KEY,)))
    node = ClusterNode.make(ClusterSettings(redis.url, "http://127.0.0.1:9", b"k" * 32),
                            "a", agent, 1)
    holder: list[Worker] = []

    @web.middleware
    async def node_path(request: web.Request, handler: Relayed) -> web.StreamResponse:
        new_call = request.method == "POST" and request.path == "/v1/realtime/calls"
        try:
            return await routing.handle_here(node, request,
                                             holder[0].answer if new_call else handler)
        except AgentError as exc:  # as the cluster's middleware answers its refusals
            return error_response(exc)

    app.middlewares.insert(0, node_path)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    holder.append(Worker(node, app[SECRETS_KEY], str(server.make_url(""))))
    yield holder[0]
    await server.close()
    await node.store.close()


async def post_call(worker: Worker, value: str) -> int:
    async with aiohttp.ClientSession() as session, session.post(
            worker.url + "/v1/realtime/calls", data="v=0\r\n",
            headers={"Authorization": f"Bearer {value}",
                     "Content-Type": "application/sdp"}) as response:
        await response.read()
        return response.status


async def test_a_call_made_by_another_worker_leaves_no_copy_here(worker: Worker) -> None:
    value = await worker.mint_in_redis()
    assert await post_call(worker, value) == 201
    assert await worker.state(value) == "used"
    assert not worker.store.knows(value) and len(worker.store) == 0
    assert await post_call(worker, value) == 401  # spent: once, cluster-wide


async def test_a_call_not_made_gives_the_secret_back_and_leaves_no_copy_here(
        worker: Worker) -> None:
    value = await worker.mint_in_redis()
    worker.answer = relayed(503)
    assert await post_call(worker, value) == 503
    assert await worker.state(value) == "unused"  # usable again, counted in Redis only
    assert not worker.store.knows(value) and len(worker.store) == 0
    worker.answer = relayed(201)
    assert await post_call(worker, value) == 201
    assert not worker.store.knows(value)


async def test_a_page_reading_with_a_secret_leaves_no_copy_here(worker: Worker) -> None:
    value = await worker.mint_in_redis()
    async with aiohttp.ClientSession() as session, session.get(
            worker.url + "/v1/models", headers={"Authorization": f"Bearer {value}"}) as response:
        assert response.status == 200, await response.text()
        json.loads(await response.text())
    assert await worker.state(value) == "unused"
    assert not worker.store.knows(value)


def test_a_secret_handed_to_redis_stops_counting_for_the_other_workers_at_once(
        tmp_path: Path) -> None:
    """A worker mints (counted in the shared tally), then Redis takes the secret over and
    the worker forgets it: the other workers see the key's count drop at once, not at the
    next refresh."""
    tallies = [SharedTally(tmp_path / "secrets.tally", i, 2, 16) for i in range(2)]
    stores = [SecretStore(max_per_tenant=1) for _ in range(2)]
    try:
        for store, tally in zip(stores, tallies, strict=True):
            store.share(tally, key_of)
        value, _ = stores[0].mint("t", 60, None, ())
        with pytest.raises(ApiError) as refused:  # the key's one unused secret is counted
            stores[1].mint("t", 60, None, ())
        assert refused.value.code == "too_many_secrets"
        stores[0].forget(value)  # published to Redis, which counts it from now on
        assert tallies[1].total(key_of("t")) == 0
        stores[1].mint("t", 60, None, ())
    finally:
        for tally in tallies:
            tally.close()
