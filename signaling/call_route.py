"""A route that names a call, declared where it is registered.

A call lives in one worker of one node; a request about it must reach that process. The
module that serves such a route declares it as a `CallRoute` (its path, and where in the
request the call id is) and registers it through that declaration (`CallRoute.add`).
signaling/owned_routes.py gathers every declaration; the workers' routing
(signaling/workers/routing.py) and the cluster's (signaling/cluster/routing.py) send a
request whose path matches one to the worker and node its id names. A websocket route
whose handler carries the connection to the owner itself (the sideband) says so
(`relayed_by_handler`); the middlewares leave it to its handler.
tests/cluster/test_call_routes.py walks the app's routes and fails for one that names a
call and would not reach its owner.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

CALL_ID = "{call_id}"  # the path segment that names the call
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class CallRoute:
    """`path` is an aiohttp path with `{call_id}` in it, or, with `query`, a plain path whose
    call id is that query parameter."""

    path: str
    query: str = ""
    relayed_by_handler: bool = False  # a websocket its handler carries to the owner
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (CALL_ID in self.path) == bool(self.query):
            raise ValueError(f"{self.path}: name the call in the path or in the query")
        head, _, tail = self.path.partition(CALL_ID)
        regex = re.escape(head) + ("([^/]+)" + re.escape(tail) if not self.query else "")
        # matches the request's path; group 1 is the call id (where the path holds it)
        object.__setattr__(self, "pattern", re.compile(f"^{regex}$"))

    def add(self, router: web.UrlDispatcher, method: str, handler: Handler) -> None:
        if method == "GET":
            router.add_get(self.path, handler)  # and HEAD, as aiohttp's add_get does
        else:
            router.add_route(method, self.path, handler)

