"""The cluster's Prometheus metrics, on the agent's own registry (so `GET /metrics` and the
workers' merged view show them): requests forwarded to other nodes and how long the hop
took, placement decisions, and Redis errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FORWARD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ClusterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.forwarded = Counter(
            "agent_cluster_forwarded_requests", "Requests forwarded to the owning or placed "
            "node", ["kind"], registry=registry)
        self.forward_seconds = Histogram(
            "agent_cluster_forward_seconds", "Time a forwarded request took, hop and answer",
            buckets=FORWARD_BUCKETS, registry=registry)
        self.placements = Counter(
            "agent_cluster_placements", "Placement decisions for new calls", ["decision"],
            registry=registry)
        self.redis_errors = Counter(
            "agent_cluster_redis_errors", "Redis commands that failed or timed out",
            registry=registry)
        self.redis_up = Gauge(
            "agent_cluster_redis_reachable", "1 while this node reaches Redis",
            registry=registry)
        self.nodes = Gauge(
            "agent_cluster_nodes", "Nodes in this node's table, by state", ["state"],
            registry=registry)
