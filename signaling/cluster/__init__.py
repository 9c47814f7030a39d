"""Cluster mode (`--cluster redis://HOST:PORT/DB`): many hosts behind one address.

What each module does: `settings` (the flags), `claim` (the node's tag, at start-up),
`store` (the Redis connection and its state), `scripts` (the atomic steps, in Lua),
`registry` (heartbeats and the node table), `signing` and `forwarding` (one signed hop to
another node), `sockets` (websockets carried to another node), `routing` (the middleware:
forward, place, redeem), `secrets` (ephemeral secrets in Redis), `leases` (upstream seats
for the remote plugins), `metrics`, `node` (it all, on the app). docs/operations.md,
Cluster, is the operator's view.

Importing this package imports no Redis client: `install` does, only with `--cluster`.
"""

from __future__ import annotations

import argparse

from aiohttp import web

from agent import worker_tag
from agent.cli_errors import exit_with_error
from signaling.cluster.settings import ClusterFlagError, ClusterSettings, settings_from_args
from signaling.cluster.settings import add_arguments as _add_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_arguments(parser)


def prepare(args: argparse.Namespace) -> ClusterSettings | None:
    """The cluster's settings, with this node's tag claimed and set on every id made from
    now on; None without `--cluster`. Exits with a coded line when it cannot join."""
    try:
        settings = settings_from_args(args)
    except ClusterFlagError as exc:
        exit_with_error(exc.code, str(exc))
    if settings is None:
        return None
    from signaling.cluster.claim import ClaimError, claim_tag

    try:
        tag = claim_tag(settings)
    except ClaimError as exc:
        exit_with_error(exc.code, str(exc))
    worker_tag.set_node(tag)
    return settings


def install(app: web.Application, settings: ClusterSettings, workers: int) -> None:
    """Join the cluster: the node's heartbeat with the app, its middleware outermost."""
    from signaling.cluster import node, routing, sockets

    node.start(app, settings, worker_tag.node_tag(), workers)
    routing.install(app)
    sockets.install(app)  # sidebands and full nodes' media streams to other nodes


__all__ = ["ClusterSettings", "add_arguments", "install", "prepare"]
