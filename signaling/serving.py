"""Run the app on its sockets until a signal stops it: aiohttp's `run_app`, with TLS per socket.

`web.run_app` puts one TLS context on every socket it serves. A worker serves two kinds: the
shared listening sockets (the server's TLS, if any) and its private unix socket, where the
other workers forward what it owns with aiohttp's unix-socket client, which speaks no TLS.
So the sites are made here, each with its own context, from aiohttp's public runner API; the
loop's life (stop on GracefulExit or Ctrl-C, cancel what is left, close) is as in run_app.

The first worker of several starts its private socket first (the supervisor starts the others
once it answers), then waits (`BEFORE_PUBLIC_KEY`, workers/routing.py) until each other worker
answers on its private socket, which they start last, after they serve the public port and
have said so; only then does it start the public sockets. It waits there so that it takes no
call on the public port while a worker still starting takes a core from it (on a 2-core
machine the first call after start-up had gaps of up to 96 ms); what connects meanwhile waits
in the listen backlog or is served by a worker already up. Its SIP calls (sip/ua.py) ring
until then.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_runner import GracefulExit

# Set by whatever must serve connections it did not accept itself (workers/handoff.py):
# called with the runner's low-level server before the sites start.
SERVER_HOOK_KEY = web.AppKey[Callable[[web.Server], None]]("low_level_server_hook")
# Awaited after the private socket and before the public ones start (workers/routing.py).
BEFORE_PUBLIC_KEY = web.AppKey[Callable[[], Awaitable[None]]]("before_public_sites")
# Set once every worker serves, where someone waits for that (SIP calls: sip/service.py).
ALL_SERVING_KEY = web.AppKey("all_workers_serving", asyncio.Event)


@dataclass(frozen=True)
class Listeners:
    """Where to serve: `host:port`, or already-bound sockets (a worker's share) plus a
    private unix socket without TLS."""

    host: str
    port: int
    sockets: Sequence[socket.socket] = ()
    private_path: str | None = None

    def sites(self, runner: web.AppRunner, tls: ssl.SSLContext | None) -> list[web.BaseSite]:
        if not self.sockets:
            return [web.TCPSite(runner, self.host, self.port, ssl_context=tls)]
        sites: list[web.BaseSite] = [web.SockSite(runner, sock, ssl_context=tls)
                                     for sock in self.sockets]
        if self.private_path is not None:
            sites.append(web.UnixSite(runner, self.private_path))
        return sites


async def _serve(app: web.Application, listeners: Listeners, tls: ssl.SSLContext | None,
                 on_listening: Callable[[], None]) -> None:
    runner = web.AppRunner(app, handle_signals=True)
    await runner.setup()
    try:
        server_hook = app.get(SERVER_HOOK_KEY)
        if server_hook is not None and runner.server is not None:
            server_hook(runner.server)
        sites = listeners.sites(runner, tls)
        private = [site for site in sites if isinstance(site, web.UnixSite)]
        public = [site for site in sites if not isinstance(site, web.UnixSite)]
        before_public = app.get(BEFORE_PUBLIC_KEY)
        if before_public is not None:  # worker 0 of several: its private socket first
            await _start_private(private, listeners)
            await before_public()
        for site in public:
            await site.start()
        on_listening()
        if before_public is None:
            # Another worker's answer here tells worker 0 this one serves (and has said so).
            await _start_private(private, listeners)
        await asyncio.Event().wait()  # until a signal's GracefulExit ends the loop
    finally:
        await runner.cleanup()


async def _start_private(sites: list[web.UnixSite], listeners: Listeners) -> None:
    for site in sites:
        await site.start()
    if listeners.private_path is not None:
        # A way in past the public port's limits: this user only (the folder may be
        # one others can enter, e.g. --worker-dir /tmp).
        os.chmod(listeners.private_path, 0o600)


def serve(app: web.Application, listeners: Listeners, tls: ssl.SSLContext | None,
          loop: asyncio.AbstractEventLoop, on_listening: Callable[[], None]) -> None:
    """Serve until SIGINT/SIGTERM (or GracefulExit); start-up errors propagate."""
    main = loop.create_task(_serve(app, listeners, tls, on_listening))
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    except (GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main.done():
                main.cancel()
                with suppress(asyncio.CancelledError):
                    loop.run_until_complete(main)
        finally:
            left = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            asyncio.set_event_loop(None)
