"""Calls held per key on a server outside a cluster (`--max-calls-per-key N`), and calls
that hold a slot before they have a leg.

A call is counted against its key from the request that makes it until it ends, whatever it
is: a WebRTC call, an RTP leg, a SIP call placed by `POST /v1/sip/calls` (from its INVITE on,
while it rings: `pending_calls`), an inbound SIP call it accepted, a media stream; a key at
its limit gets 429 `tenant_limit` for a new call of any kind but a media stream (counted,
not refused), and for accepting a ringing inbound SIP call. The middleware counts a
new-call request as held while it is handled (a burst of requests, all read before any leg
exists, sees each other), and the leg or pending call once it exists. With several
workers each counts its own and claims against the others' in the workers' shared tally
(workers/limits.py), so the limit is the server's. In a cluster the cluster's placement
counts the calls instead (cluster/routing.py, in Redis).

`pending_calls(app)`: the calls that hold a slot but have no leg yet (registered by their
owners: the SIP dialer's ringing outbound calls), counted in `/health` (`pending_calls`), in
`agent_pending_calls` of /metrics, in the key's limit and in the cluster's heartbeat.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Protocol

from aiohttp import web
from prometheus_client import Gauge

from signaling.auth import Principal
from signaling.errors import ApiError
from signaling.keys import AGENT_KEY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PendingSource = Callable[[], Mapping[str, object]]  # call id -> owner
PENDING_CALLS_KEY = web.AppKey("pending_call_sources", list)
NEW_CALL_PATHS = frozenset({"/v1/realtime/calls", "/offer", "/v1/telephony/rtp",
                            "/v1/sip/calls"})
ACCEPT_PATH = re.compile(r"^/v1/realtime/calls/[^/]+/accept$")  # a ringing SIP call answered


def add_pending_calls(app: web.Application, source: PendingSource) -> None:
    app[PENDING_CALLS_KEY] = [*app.get(PENDING_CALLS_KEY, []), source]


def pending_calls(app: web.Application) -> dict[str, object]:
    """Calls that hold a slot without a leg (yet): id -> owner."""
    legs = app[AGENT_KEY].legs
    found: dict[str, object] = {}
    for source in app.get(PENDING_CALLS_KEY, ()):
        found.update((call, owner) for call, owner in source().items() if call not in legs)
    return found


def tenant_key(owner: object) -> str | None:
    """The key a call counts against (None: none, an ephemeral secret's own is its key's)."""
    return str(owner.tenant) if isinstance(owner, Principal) else None


def is_new_call(request: web.Request) -> bool:
    """A request that makes a call the key then holds: a new one, or an inbound SIP call
    accepted (its leg becomes the key's)."""
    return request.method == "POST" and (request.path in NEW_CALL_PATHS
                                         or ACCEPT_PATH.match(request.path) is not None)


class SharedCounts(Protocol):
    def claim(self, key: int, value_here: int, limit: int) -> bool | None: ...

    def replace_here(self, values: Mapping[int, int]) -> None: ...


class KeyCallLimit:
    def __init__(self, app: web.Application, limit: int) -> None:
        self.app, self.limit = app, limit
        self.arriving: Counter[str] = Counter()
        self.refused = 0
        self._shared: SharedCounts | None = None
        self._key_of: Callable[[str], int] = lambda tenant: 0

    def share(self, shared: SharedCounts | None, key_of: Callable[[str], int]) -> None:
        self._shared, self._key_of = shared, key_of

    def held(self) -> Counter[str]:
        """Calls held here per key: legs, pending calls, requests making one."""
        counts: Counter[str] = Counter(self.arriving)
        for leg in self.app[AGENT_KEY].legs:
            tenant = tenant_key(leg.owner)
            if tenant is not None:
                counts[tenant] += 1
        for owner in pending_calls(self.app).values():
            tenant = tenant_key(owner)
            if tenant is not None:
                counts[tenant] += 1
        return counts

    def publish(self) -> None:
        if self._shared is not None:
            self._shared.replace_here({self._key_of(t): n for t, n in self.held().items()})

    def _refuse(self) -> ApiError:
        self.refused += 1
        return ApiError("tenant_limit", f"this key already holds {self.limit} concurrent "
                        "calls (--max-calls-per-key); end one or retry later",
                        headers={"Retry-After": "5"}, status=429)

    @contextlib.contextmanager
    def admit(self, tenant: str) -> Iterator[None]:
        held = self.held()[tenant] + 1
        if held > self.limit:
            raise self._refuse()
        if self._shared is not None and self._shared.claim(
                self._key_of(tenant), held, self.limit) is False:
            raise self._refuse()
        self.arriving[tenant] += 1
        try:
            yield
        finally:
            self.arriving[tenant] -= 1
            if not self.arriving[tenant]:
                del self.arriving[tenant]
            self.publish()


KEY_CALL_LIMIT_KEY = web.AppKey("key_call_limit", KeyCallLimit)


@web.middleware
async def key_limit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    limit = request.app.get(KEY_CALL_LIMIT_KEY)
    principal = request.get("principal")
    if limit is None or not is_new_call(request) or not isinstance(principal, Principal):
        return await handler(request)
    with limit.admit(str(principal.tenant)):
        return await handler(request)


def install_key_limit(app: web.Application, limit: int) -> None:
    """`--max-calls-per-key` on a server outside a cluster (innermost: after auth)."""
    if limit > 0:
        app[KEY_CALL_LIMIT_KEY] = KeyCallLimit(app, limit)
        app.middlewares.append(key_limit_middleware)


def install_pending_metrics(app: web.Application) -> None:
    """`agent_pending_calls`: calls that hold a slot without a leg (ringing outbound SIP)."""
    gauge = Gauge("agent_pending_calls", "Calls holding a slot without a media leg yet "
                  "(outbound SIP calls while they ring)",
                  registry=app[AGENT_KEY].metrics.registry)
    gauge.set_function(lambda: float(len(pending_calls(app))))
