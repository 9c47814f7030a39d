"""The shared half of the remote-engine plugins: pool, per-call links, the batched step.

A link is opened in `prepare_runtime_config` (on the event loop, so the offer gets a 503 when
every engine is full) and parked under a token in `RuntimeConfig.options`; `create_session`
(ticker thread) claims it. A parked link that nobody claims — the offer failed after the
engine session opened — is closed at once when the agent discards its config, and after
`claim_timeout` seconds otherwise, so no engine seat leaks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
import numpy as np

from agent.logs.log_safe import printable
from agent.plugins.base import (
    Capabilities,
    Plugin,
    PluginError,
    PluginFlag,
    PluginOptions,
    PluginSession,
    RuntimeConfig,
    SessionConfig,
    StepOutput,
    check_extra_body,
)
from agent.plugins.remote.link import LinkRequest, LinkSettings, UpstreamError, UpstreamLink
from agent.plugins.remote.parked import ParkedLinks
from agent.plugins.remote.pool import WARMUP_SECONDS, UpstreamPool
from agent.plugins.remote.seats import SeatHold, SeatLeases

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; a typing-only name (requires-python is 3.10)

log = logging.getLogger(__name__)

LINK_TOKEN = "upstream_link"
SAMPLE_RATE = 24000
FRAME_SIZE = 1920
CLAIM_TIMEOUT_SECONDS = 10.0


class RemoteSession(PluginSession):
    def __init__(self, config: RuntimeConfig, link: UpstreamLink) -> None:
        super().__init__(config)
        self.link = link

    def stats(self) -> dict[str, Any]:
        return self.link.stats()


def seat_lost(link: UpstreamLink) -> None:
    """The session's seat was taken by another server: it ends at its next frame."""
    link.fail(UpstreamError("upstream_lease_lost", "another server took this call's engine "
                            "seat", status=503))


class RemotePlugin(Plugin):
    link_class: ClassVar[type[UpstreamLink]]
    default_capacity: ClassVar[int] = 0  # per upstream; 0 = unlimited
    runs_per_worker: ClassVar[bool] = True  # the model is elsewhere; each worker has a pool
    model_flags: ClassVar[frozenset[str] | None] = frozenset({"--upstream", "--model",
                                                               "--voice"})
    flags: ClassVar[tuple[PluginFlag, ...]] = (
        PluginFlag("--upstream-capacity", "concurrent calls per --upstream (default: vllm-omni "
                   "unlimited, moshi-server 1)", type=int, metavar="CALLS"),
        PluginFlag("--upstream-handshake-timeout", "seconds a remote engine may take to accept "
                   "a session (a Moshi server prefills its prompt first)", default=20.0,
                   type=float, metavar="S"),
        PluginFlag("--upstream-warmup-timeout", "seconds a remote engine that accepts "
                   "connections but holds the websocket upgrade (warming up) is waited for "
                   "before it counts as failed; callers meanwhile get 503 "
                   "upstreams_warming_up", default=WARMUP_SECONDS, type=float, metavar="S"),
        PluginFlag("--upstream-stall-timeout", "seconds without a message from a remote engine "
                   "before the call gets an error", default=5.0, type=float, metavar="S"),
    )

    def __init__(
        self,
        upstreams: Sequence[str],
        *,
        capacity: int | None = None,
        model: str | None = None,
        voice: str | None = None,
        settings: LinkSettings | None = None,
        pool: UpstreamPool | None = None,
        claim_timeout: float = CLAIM_TIMEOUT_SECONDS,
    ) -> None:
        self.pool = pool or UpstreamPool(
            upstreams, self.default_capacity if capacity is None else capacity
        )
        self.model = model
        self.voice = voice
        self.settings = settings or LinkSettings()
        self.claim_timeout = claim_timeout
        self._capabilities = Capabilities(
            sample_rate=SAMPLE_RATE, frame_size=FRAME_SIZE,
            max_sessions=self.pool.total_capacity, emits_text=True, default_voice=voice,
        )
        self._http: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._parked = ParkedLinks()
        self._links: set[UpstreamLink] = set()
        self._closers: set[asyncio.Task[None]] = set()
        # Seats shared with other servers (a cluster: seats.py); None: this pool's own only.
        self.seat_leases: SeatLeases | None = None
        self._holds: dict[UpstreamLink, SeatHold] = {}

    def use_seat_leases(self, leases: SeatLeases | None) -> None:
        """Hold a seat in `leases` for every session on an upstream of limited capacity."""
        self.seat_leases = leases

    @classmethod
    def from_options(cls, options: PluginOptions) -> Self:
        capacity = options.extra.get("upstream_capacity")
        defaults = LinkSettings()
        settings = replace(
            defaults,
            handshake_timeout=float(options.extra.get("upstream_handshake_timeout",
                                                      defaults.handshake_timeout)),
            stall_timeout=float(options.extra.get("upstream_stall_timeout",
                                                  defaults.stall_timeout)),
        )
        if not (settings.handshake_timeout > 0 and settings.stall_timeout > 0):
            raise PluginError("invalid_option", "upstream timeouts must be positive seconds",
                              status=500)
        warmup_seconds = float(options.extra.get("upstream_warmup_timeout", WARMUP_SECONDS))
        if warmup_seconds < 0:
            raise PluginError("invalid_option", "--upstream-warmup-timeout must be 0 or more",
                              status=500)
        pool = UpstreamPool(options.upstreams,
                            cls.default_capacity if capacity is None else int(capacity),
                            warmup_seconds=warmup_seconds)
        return cls(
            options.upstreams, capacity=capacity, model=options.model, voice=options.voice,
            settings=settings, pool=pool,
        )

    def capabilities(self) -> Capabilities:
        return self._capabilities

    def health(self) -> dict[str, Any]:
        return {"upstreams": self.pool.describe()}

    async def start(self) -> None:
        self._ensure_started()

    def _ensure_started(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._loop = asyncio.get_running_loop()
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        for link in self._parked.take_all():
            self._close_link(link)
        for link in list(self._links):
            self._close_link(link)
        if self._closers:
            await asyncio.gather(*list(self._closers), return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    # -- event loop -------------------------------------------------------------------------

    async def validate_session_config(self, session_config: SessionConfig) -> None:
        # Only the engine can judge a voice or persona; opening a session here would hold an
        # engine seat for a call that may never come.
        check_extra_body(self, session_config.extra_body, frozenset())

    def link_request(self, session_config: SessionConfig) -> LinkRequest:
        """What the engine is asked for: the caller's voice and instructions."""
        return LinkRequest(voice=session_config.voice or self.voice,
                           instructions=session_config.instructions, model=self.model)

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        await self.validate_session_config(session_config)
        request = self.link_request(session_config)
        link = await self._open_link(request)
        token = self._parked.park(link)
        assert self._loop is not None
        self._loop.call_later(self.claim_timeout, self._expire_parked, token)
        return RuntimeConfig(
            voice=request.voice, instructions=request.instructions,
            options={LINK_TOKEN: token, "upstream": link.label},
        )

    async def _open_link(self, request: LinkRequest) -> UpstreamLink:
        http = self._ensure_started()
        last_error: UpstreamError | None = None
        for _ in range(2 * len(self.pool.upstreams)):
            try:
                lease = self.pool.acquire()
            except PluginError:
                if last_error is not None:
                    raise last_error from None
                raise
            link = self.link_class(lease, self.settings, SAMPLE_RATE, FRAME_SIZE)
            hold = None
            if self.seat_leases is not None and lease.upstream.capacity:
                try:
                    hold = await self.seat_leases.hold(lease.url, lease.upstream.capacity,
                                                       functools.partial(seat_lost, link))
                except BaseException:
                    lease.release()
                    raise
                if hold is None:  # every seat held by other servers
                    lease.release()
                    self.pool.mark_full(lease.upstream)
                    last_error = UpstreamError("upstreams_full", "every seat of the model "
                                               "server is held by another server", status=503)
                    continue
            try:
                await link.open(http, request)
            except UpstreamError as exc:
                if hold is not None:
                    hold.release()
                lease.release()
                if exc.pool_effect is None:
                    raise  # the engine refused this session itself: another would too
                if exc.pool_effect == "full":
                    self.pool.mark_full(lease.upstream)
                elif exc.pool_effect == "warming":
                    self.pool.mark_warming(lease.upstream)
                else:
                    self.pool.mark_failed(lease.upstream, exc.code)
                log.warning("upstream %s: %s: %s", lease.label, exc.code, printable(exc.message))
                last_error = exc
                continue
            except BaseException:
                if hold is not None:
                    hold.release()
                lease.release()
                raise
            self.pool.mark_ok(lease.upstream)
            self._links.add(link)
            if hold is not None:
                self._holds[link] = hold
            log.info("upstream %s session %s opened", lease.label, link.upstream_session_id)
            return link
        assert last_error is not None
        raise last_error

    def _expire_parked(self, token: str) -> None:
        link = self._parked.claim(token)
        if link is not None:
            log.warning("upstream %s: session never claimed by a call; closing it", link.label)
            self._close_link(link)

    def discard_runtime_config(self, config: RuntimeConfig) -> None:
        # The offer failed after its engine session opened: give the seat back now rather
        # than when the claim timeout fires.
        link = self._parked.claim(config.options.get(LINK_TOKEN))
        if link is not None:
            self._close_link(link)

    def _close_link(self, link: UpstreamLink) -> None:
        """Start closing a link; `close` waits for every one started (loop)."""
        async def close() -> None:
            try:
                await link.close()
            finally:
                self._links.discard(link)
                hold = self._holds.pop(link, None)
                if hold is not None:
                    hold.release()

        task = asyncio.ensure_future(close())
        task.set_name(f"upstream:{link.label}:close")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    # -- ticker thread ----------------------------------------------------------------------

    def create_session(self, config: RuntimeConfig) -> RemoteSession:
        link = self._parked.claim(config.options.get(LINK_TOKEN))
        if link is None:
            raise PluginError(
                "upstream_session_expired",
                "the model server session was not claimed in time; call again", status=503,
            )
        return RemoteSession(config, link)

    def close_session(self, session: PluginSession) -> None:
        assert isinstance(session, RemoteSession)
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._close_link, session.link)
            except RuntimeError:  # loop already closed
                pass

    def restart_session(self, session: PluginSession) -> None:
        # An engine session cannot be sent back to its prompt: drop what is queued to play.
        assert isinstance(session, RemoteSession)
        session.link.restart()

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        outputs = []
        for session, frame in batch:
            assert isinstance(session, RemoteSession)
            outputs.append(session.link.exchange(frame))
        return outputs
