"""The event-loop side of a link: the websocket, its reader and writer tasks, a bounded queue.

The link decides what messages mean (`on_message`) and what a failure does (`on_failure`);
this class only moves bytes and says when the connection broke.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from yarl import URL

from agent.plugins.remote.latency import LinkLatency
from agent.plugins.remote.link_types import MAX_MESSAGE_BYTES, LinkSettings, Outgoing, UpstreamError

log = logging.getLogger(__name__)

MessageHandler = Callable[[aiohttp.WSMessage, float], None]
FailureHandler = Callable[[UpstreamError], None]


async def accepts_tcp(url: str, timeout: float) -> bool:
    """Whether the URL's host takes a TCP connection within `timeout` seconds."""
    parsed = URL(url)
    if parsed.host is None or parsed.port is None:
        return False
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parsed.host, parsed.port),
                                           timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


class LinkSocket:
    def __init__(self, label: str, settings: LinkSettings, latency: LinkLatency,
                 on_message: MessageHandler, on_failure: FailureHandler) -> None:
        self.label = label
        self.settings = settings
        self.latency = latency
        self.on_message = on_message
        self.on_failure = on_failure
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.accepting = True  # False once the link fails or closes: input is dropped
        self.closing = False  # a close the link asked for is not a failure
        self.last_inbound_at = time.monotonic()
        self.dropped_input_frames = 0
        self._outgoing: deque[Outgoing] = deque()
        self._outgoing_ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def connect(self, http: aiohttp.ClientSession,
                      url: str) -> aiohttp.ClientWebSocketResponse:
        """Open the websocket; raise UpstreamError (the server is failing) when it cannot."""
        try:
            self.ws = await asyncio.wait_for(
                http.ws_connect(url, max_msg_size=MAX_MESSAGE_BYTES, autoping=True),
                self.settings.connect_timeout,
            )
        except asyncio.TimeoutError:
            if await accepts_tcp(url, self.settings.connect_timeout):
                # vllm-omni holds the upgrade while its engine warms up (up to minutes):
                # that is a server starting, not a server failing.
                raise UpstreamError(
                    "upstream_warming_up", f"model server {self.label} accepts connections "
                    f"but did not answer the websocket upgrade within "
                    f"{self.settings.connect_timeout:g} s (warming up?)", status=503,
                    pool_effect="warming",
                ) from None
            raise UpstreamError(
                "upstream_unreachable", f"no answer from model server {self.label} within "
                f"{self.settings.connect_timeout:g} s", status=503, pool_effect="failed",
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError(
                "upstream_unreachable", f"model server {self.label} cannot be reached: {exc}",
                status=503, pool_effect="failed",
            ) from None
        return self.ws

    def start(self) -> None:
        """Begin reading and writing (after the handshake)."""
        self.last_inbound_at = time.monotonic()
        self.spawn(self._read(), "read")
        self.spawn(self._write(), "write")

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"upstream:{self.label}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                now = time.monotonic()
                self.last_inbound_at = now
                if message.type == aiohttp.WSMsgType.ERROR:
                    raise UpstreamError(
                        "upstream_closed", f"the connection to the model server failed: "
                        f"{self.ws.exception()}", pool_effect="failed",
                    )
                self.on_message(message, now)
            if not self.closing:
                code = self.ws.close_code
                # A normal close is the engine ending this session; anything else (going
                # away, abort, 1006) says the server itself is in trouble.
                self.on_failure(UpstreamError(
                    "upstream_closed", f"the model server closed the connection (code {code})",
                    pool_effect=None if code == 1000 else "failed",
                ))
        except UpstreamError as exc:
            self.on_failure(exc)
        except Exception as exc:
            log.exception("upstream %s: reader failed", self.label)
            self.on_failure(UpstreamError("upstream_failed",
                                          f"reading from the model server failed: {exc}"))

    async def _write(self) -> None:
        assert self.ws is not None
        try:
            while True:
                while not self._outgoing:
                    self._outgoing_ready.clear()
                    await self._outgoing_ready.wait()
                item = self._outgoing.popleft()
                if isinstance(item.payload, bytes):
                    await self.ws.send_bytes(item.payload)
                else:
                    await self.ws.send_str(item.payload)
                self.latency.frames_sent(item.frames, item.queued_at, time.monotonic())
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            self.on_failure(UpstreamError(
                "upstream_closed", f"sending to the model server failed: {exc}",
                pool_effect="failed",
            ))

    def enqueue(self, item: Outgoing) -> None:
        """Queue input for the writer; the oldest goes when the queue is full."""
        if not self.accepting:
            return
        if len(self._outgoing) >= self.settings.max_queued_input_frames:
            dropped = self._outgoing.popleft()
            self.dropped_input_frames += dropped.frames
        self._outgoing.append(item)
        self._outgoing_ready.set()

    async def stop_tasks(self) -> None:
        """Cancel the reader and writer (not the task running this) and wait for them."""
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close_ws(self) -> None:
        if self.ws is not None and not self.ws.closed:
            try:
                await asyncio.wait_for(self.ws.close(), self.settings.close_timeout)
            except Exception as exc:
                log.debug("upstream %s: close failed: %r", self.label, exc)
