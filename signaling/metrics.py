"""`GET /metrics`: the agent's Prometheus registry in the text exposition format.

Not in auth's public paths, so with `--api-key` it needs a key (an ephemeral secret gets
403). The event-loop lag sampler and the garbage-collector pause timer live here: they are
properties of the server process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Histogram, generate_latest

from signaling.keys import AGENT_KEY

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
    watcher = gc_pause_watcher(app[AGENT_KEY].metrics.gc_pause)
    gc.callbacks.append(watcher)
    yield
    gc.callbacks.remove(watcher)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def gc_pause_watcher(histogram: Histogram) -> Callable[[str, dict[str, Any]], None]:
    """A `gc.callbacks` entry timing each collector pass (it runs on whichever thread
    triggered the pass; the histogram is thread-safe)."""
    started: list[float] = [0.0]
    by_generation = [histogram.labels(str(generation)) for generation in range(3)]

    def watch(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started[0])

    return watch


def add_routes(app: web.Application) -> None:
    app.router.add_get("/metrics", get_metrics)
    app.cleanup_ctx.append(_loop_lag_context)
