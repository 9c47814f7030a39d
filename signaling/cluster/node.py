"""This node's part of the cluster, made once per process and kept on the app: its tag, the
Redis store, the node table and the heartbeat that fills it, the forwarder to the other
nodes, the shared secrets and the metrics. Started and stopped with the app."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agent.media_agent import MediaAgent
from signaling.call_limit import pending_calls
from signaling.cluster.forwarding import Forwarder
from signaling.cluster.leases import RedisSeats
from signaling.cluster.metrics import ClusterMetrics
from signaling.cluster.registry import Heartbeat, NodeTable
from signaling.cluster.secrets import ClusterSecrets
from signaling.cluster.settings import ClusterSettings
from signaling.cluster.signing import NodeGate, NodeSigner
from signaling.cluster.store import Store
from signaling.ice import rtc_network
from signaling.keys import AGENT_KEY
from signaling.sip.service import SIP_SERVICE_KEY
from signaling.telephony import TELEPHONY_KEY
from signaling.workers.routing import WORKERS_KEY

log = logging.getLogger(__name__)


@dataclass
class ClusterNode:
    settings: ClusterSettings
    tag: str
    store: Store
    table: NodeTable
    heartbeat: Heartbeat
    forwarder: Forwarder
    secrets: ClusterSecrets
    metrics: ClusterMetrics
    seats: RedisSeats | None = None  # a remote plugin's engine seats (leases.py)

    @classmethod
    def make(cls, settings: ClusterSettings, tag: str, agent: MediaAgent,
             workers: int, media: dict[str, Any] | None = None,
             pending: Callable[[], Mapping[str, object]] | None = None,
             sip: bool | None = None) -> ClusterNode:
        store = Store(settings.redis_url, settings.prefix)
        table = NodeTable()
        metrics = ClusterMetrics(agent.metrics.registry)
        store.on_error = metrics.redis_errors.inc
        metrics.redis_up.set_function(lambda: 1.0 if store.reachable else 0.0)
        for state in ("serving", "draining", "starting"):
            metrics.nodes.labels(state).set_function(functools.partial(table.count, state))
        signer = NodeSigner(tag, settings.secret)
        forwarder = Forwarder(signer, NodeGate(signer, store.first_use), settings.node_tls())
        return cls(settings, tag, store, table,
                   Heartbeat(settings, store, agent, tag, workers, table, media, pending, sip),
                   forwarder, ClusterSecrets(store), metrics)

    def view(self) -> dict[str, Any]:
        """What /health shows of the cluster, as this node sees it."""
        nodes = self.table.view()
        return {"node": self.tag, "address": self.settings.node_address,
                "redis_reachable": self.store.reachable, "heartbeats": self.heartbeat.beats,
                "redis_round_trips": self.store.round_trips,
                "registry_round_trips": self.heartbeat.syncs, "nodes": nodes}


CLUSTER_KEY = web.AppKey("cluster_node", ClusterNode)


def media_record(app: web.Application, settings: ClusterSettings) -> dict[str, Any]:
    """Where this node's media goes, for its registry record: the addresses ICE host
    candidates are gathered on (--ice-host; empty: every interface), the WebRTC port range,
    shared UDP port and advertised addresses (--rtc-ports, --rtc-udp-port, --rtc-advertise),
    and the RTP legs' bind and advertised address and ports."""
    media: dict[str, Any] = {"ice_hosts": list(settings.ice_hosts),
                             "rtc": rtc_network(app[AGENT_KEY].settings)}
    telephony = app.get(TELEPHONY_KEY)
    if telephony is not None:
        rtp = telephony.rtp
        media["rtp"] = {"bind": rtp.bind_host, "advertise": rtp.advertised_host or rtp.bind_host,
                        "ports": f"{rtp.port_min}-{rtp.port_max}"}
    return media


async def _running(app: web.Application) -> AsyncIterator[None]:
    node = app[CLUSTER_KEY]
    await node.heartbeat.beat()  # the table before the first request (Redis down: empty)
    task = asyncio.get_running_loop().create_task(node.heartbeat.run(), name="cluster")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await node.heartbeat.leave()
    if node.seats is not None:
        await node.seats.close()
    await node.forwarder.close()
    await node.store.close()


def start(app: web.Application, settings: ClusterSettings, tag: str, workers: int) -> None:
    agent = app[AGENT_KEY]
    # Only worker 0 serves SIP (sip/service.py): it says whether the node does.
    serves_sip = SIP_SERVICE_KEY in app
    node = app[CLUSTER_KEY] = ClusterNode.make(
        settings, tag, agent, workers, media_record(app, settings),
        functools.partial(pending_calls, app),
        serves_sip if serves_sip or app.get(WORKERS_KEY) is None
        or app[WORKERS_KEY].index == 0 else None)
    use_seat_leases = getattr(agent.plugin, "use_seat_leases", None)
    if callable(use_seat_leases):  # a remote plugin: its engines' seats are the cluster's
        node.seats = RedisSeats(node.store)
        use_seat_leases(node.seats)
    app.cleanup_ctx.append(_running)
