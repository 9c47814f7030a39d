"""`GET /metrics`: the agent's Prometheus registry in the text exposition format.

Not in auth's public paths, so with `--api-key` it needs a key (an ephemeral secret gets
403). The event-loop lag sampler lives here: it is a property of the server process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .keys import AGENT_KEY

LOOP_LAG_INTERVAL = 0.5


async def get_metrics(request: web.Request) -> web.Response:
    registry = request.app[AGENT_KEY].metrics.registry
    # Collection reads plain Python state and takes well under a millisecond per call.
    body = generate_latest(registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def _sample_loop_lag(app: web.Application) -> None:
    histogram = app[AGENT_KEY].metrics.loop_lag
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(LOOP_LAG_INTERVAL)
        # Anything beyond the interval is time the loop was busy with something else.
        histogram.observe(max(0.0, loop.time() - asked - LOOP_LAG_INTERVAL))


async def _loop_lag_context(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(_sample_loop_lag(app), name="loop-lag")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", get_metrics)
    app.cleanup_ctx.append(_loop_lag_context)
