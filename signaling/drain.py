"""Graceful drain for rolling deploys: `POST /admin/drain` and SIGTERM (wired in __main__).

A drain stops admission at once (offers get 503 `draining` + `Retry-After`, `/health/ready`
fails so the balancer stops sending), lets live calls run until they end or the drain
deadline (`--drain-seconds`) passes, then ends the rest: a WebRTC call gets a `call.ending`
event (reason `server_draining`) on its data channel first, a telephony leg a clean close of
its transport. Then `on_drained` runs; the CLI uses it to exit 0.

Who may drain over HTTP: on a server with keys, only an operator (`--admin-key`); a tenant's
API key or an ephemeral secret gets 403 `operator_only`, and a server with API keys but no
admin key drains by signal only. An open server (no keys) lets anyone who reaches it drain,
as it lets anyone call; the page it serves never posts there by itself (docs/web.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from agent.end_reason import EndReason
from agent.media_agent import MediaAgent
from signaling.auth import AUTH_SETTINGS_KEY, principal_of
from signaling.errors import ApiError
from signaling.keys import AGENT_KEY

log = logging.getLogger(__name__)

DEFAULT_DRAIN_SECONDS = 30.0
DRAIN_REASON = EndReason.SERVER_DRAINING
POLL_INTERVAL = 0.1


class DrainController:
    def __init__(self, agent: MediaAgent, seconds: float = DEFAULT_DRAIN_SECONDS) -> None:
        self.agent = agent
        self.seconds = max(0.0, seconds)
        self.on_drained: Callable[[], None] | None = None
        self.started_at: float | None = None
        self.calls_at_start = 0
        self.done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def live_calls(self) -> int:
        return len(self.agent.legs)

    def start(self, why: str) -> None:
        """Begin draining (idempotent): admission stops before this returns."""
        if self.started_at is not None:
            return
        self.agent.draining = True
        self.started_at = time.monotonic()
        self.calls_at_start = self.live_calls()
        log.info("drain started (%s): %d live call(s), deadline %g s", why,
                 self.calls_at_start, self.seconds)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="drain")

    def seconds_left(self) -> float:
        if self.started_at is None:
            return self.seconds
        return max(0.0, self.started_at + self.seconds - time.monotonic())

    async def _run(self) -> None:
        try:
            while self.live_calls() and self.seconds_left() > 0:
                await asyncio.sleep(POLL_INTERVAL)
            await self._end_remaining()
            log.info("drain finished after %.1f s", time.monotonic() - (self.started_at or 0))
        finally:
            self.done.set()
        if self.on_drained is not None:
            self.on_drained()

    async def _end_remaining(self) -> None:
        message = "the server is restarting; please call again"
        ends = [leg.end_with_notice(DRAIN_REASON, message) for leg in self.agent.legs]
        if ends:
            log.info("drain deadline: ending %d call(s)", len(ends))
            await asyncio.gather(*ends, return_exceptions=True)

    async def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def describe(self) -> dict[str, object]:
        return {
            "draining": self.draining,
            "active_calls": self.live_calls(),
            "calls_at_start": self.calls_at_start,
            "seconds_left": round(self.seconds_left(), 1),
        }


DRAIN_KEY = web.AppKey("drain", DrainController)


def check_may_drain(request: web.Request) -> None:
    """Only an operator drains a server with keys (a coded 403 for anyone else)."""
    if request.app[AUTH_SETTINGS_KEY].open or principal_of(request).operator:
        return
    raise ApiError("operator_only", "only an --admin-key may drain this server (without "
                   "one, drain it with SIGTERM)", status=403)


async def post_drain(request: web.Request) -> web.Response:
    check_may_drain(request)
    controller = request.app[DRAIN_KEY]
    controller.start("POST /admin/drain")
    return web.json_response(controller.describe(), status=202)


def setup(app: web.Application, seconds: float) -> DrainController:
    controller = DrainController(app[AGENT_KEY], seconds)
    app[DRAIN_KEY] = controller
    app.router.add_post("/admin/drain", post_drain)

    async def context(app: web.Application) -> AsyncIterator[None]:
        yield
        await controller.cancel()

    app.cleanup_ctx.append(context)
    return controller


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--drain-seconds", type=float, default=DEFAULT_DRAIN_SECONDS, metavar="S",
        help="on SIGTERM or POST /admin/drain: stop admitting, let live calls run up to S "
        f"seconds, then end the rest and exit (default {DEFAULT_DRAIN_SECONDS:g}; a second "
        "SIGTERM ends at once)")
