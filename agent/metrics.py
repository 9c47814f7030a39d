"""Prometheus metrics for one media agent, on a registry of its own.

Each agent gets its own CollectorRegistry (never the process-global one) so several agents in
one process (tests, benchmarks) don't collide. Two kinds of figures:
- events counted when they happen (calls started/ended, refusals, per-tick histograms);
- state read at scrape time (active calls, late ticks, outbound packets of live calls), so
  the hot paths (ticker, outbound track) pay nothing but an attribute update.
"""

from __future__ import annotations

from collections import Counter as TallyCounter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent.end_reason import Ending, EndReason
from agent.leg import media_counts

if TYPE_CHECKING:
    from agent.leg_registry import LegRegistry
    from agent.plugins.base import Plugin
    from agent.ticker import Ticker

# 80 ms frames: buckets from well under a frame to several frames.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.2, 0.5)
LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 1.0)
LOOP_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class LiveAgent(Protocol):
    """What a scrape reads of the agent (a `MediaAgent` is one): its plugin's health, its
    live legs and its ticker's counters."""

    plugin: Plugin
    legs: LegRegistry
    ticker: Ticker


class AgentMetrics:
    def __init__(self, plugin_id: str) -> None:
        self.plugin_id = plugin_id
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls_started = Counter(
            "agent_calls_started", "Calls admitted, by transport and plugin.",
            ["transport", "plugin"], registry=r)
        self.calls_ended = Counter(
            "agent_calls_ended", "Calls ended, by transport and end reason.",
            ["transport", "reason"], registry=r)
        self.refusals = Counter(
            "agent_admission_refusals", "Calls refused at admission, by error code.",
            ["code"], registry=r)
        self.tick_step = Histogram(
            "agent_ticker_step_seconds", "Time one batched plugin step took.",
            ["plugin"], buckets=STEP_BUCKETS, registry=r)
        self.tick_lateness = Histogram(
            "agent_ticker_lateness_seconds", "How late a tick started against its schedule.",
            ["plugin"], buckets=LATENESS_BUCKETS, registry=r)
        self.loop_lag = Histogram(
            "agent_event_loop_lag_seconds",
            "How much later than asked a periodic sleep on the event loop woke.",
            buckets=LOOP_LAG_BUCKETS, registry=r)
        self.gc_pause = Histogram(
            "agent_gc_pause_seconds",
            "Cyclic garbage collector passes, by generation (every thread stops meanwhile).",
            ["generation"], buckets=GC_PAUSE_BUCKETS, registry=r)
        # Totals of ended calls; live calls are added at scrape time.
        self.ended_totals: TallyCounter[tuple[str, str]] = TallyCounter()
        self._step = self.tick_step.labels(plugin_id)
        self._lateness = self.tick_lateness.labels(plugin_id)

    def observe_tick(self, step_seconds: float, lateness_seconds: float) -> None:
        self._step.observe(step_seconds)
        self._lateness.observe(max(0.0, lateness_seconds))

    def call_started(self, transport: str) -> None:
        self.calls_started.labels(transport, self.plugin_id).inc()

    def call_ended(self, transport: str, reason: Ending | None, media: dict[str, int]) -> None:
        self.calls_ended.labels(transport, reason or EndReason.UNKNOWN).inc()
        for name, value in media.items():
            self.ended_totals[(transport, name)] += value

    def refused(self, code: str) -> None:
        self.refusals.labels(code).inc()

    def attach(self, agent: LiveAgent) -> None:
        self.registry.register(_LiveState(agent, self))


def _upstream_families(upstreams: list[dict[str, Any]]) -> Iterator[Metric]:
    """A remote-engine plugin's pool (its `health()["upstreams"]`, URLs already redacted)."""
    open_sessions = GaugeMetricFamily("agent_upstream_open_sessions",
                                      "Engine sessions open on each upstream.", labels=["upstream"])
    healthy = GaugeMetricFamily("agent_upstream_healthy",
                                "1 while an upstream takes calls, 0 while backed off.",
                                labels=["upstream"])
    failures = CounterMetricFamily("agent_upstream_failures",
                                   "Upstream failures (unreachable, dropped sessions).",
                                   labels=["upstream"])
    rtt = HistogramMetricFamily("agent_upstream_rtt_seconds",
                                "Input frame sent to the upstream → its answering frame back.",
                                labels=["upstream"])
    for upstream in upstreams:
        label = [str(upstream["url"])]
        open_sessions.add_metric(label, upstream["active"])
        healthy.add_metric(label, 1 if upstream["healthy"] else 0)
        failures.add_metric(label, upstream.get("failures_total", 0))
        histogram = upstream.get("rtt_seconds")
        if histogram:
            buckets = [("+Inf" if bound == "inf" else bound, count)
                       for bound, count in histogram["buckets"].items()]
            rtt.add_metric(label, buckets, histogram["sum"])
    yield from (open_sessions, healthy, failures, rtt)


class _LiveState(Collector):
    """State read from the agent at scrape time."""

    def __init__(self, agent: LiveAgent, metrics: AgentMetrics) -> None:
        self.agent = agent
        self.metrics = metrics

    def _upstreams(self) -> Iterator[Metric]:
        health = self.agent.plugin.health()
        upstreams = health.get("upstreams") if isinstance(health, dict) else None
        if upstreams:
            yield from _upstream_families(upstreams)

    def collect(self) -> Iterator[Metric]:
        plugin = self.metrics.plugin_id
        active = GaugeMetricFamily("agent_active_calls", "Live calls by transport and plugin.",
                                   labels=["transport", "plugin"])
        per_transport = self.agent.legs.count_by_transport()
        totals = TallyCounter(self.metrics.ended_totals)
        for leg in self.agent.legs:
            for name, value in media_counts(leg).items():
                totals[(leg.transport, name)] += value
        for transport, count in sorted(per_transport.items()):
            active.add_metric([transport, plugin], count)
        yield active
        for name, metric, help_text in (
            ("packets", "agent_outbound_packets", "Outbound audio packets (20 ms each)."),
            ("bytes", "agent_outbound_bytes", "Outbound encoded audio payload bytes."),
            ("underruns", "agent_playout_underruns", "20 ms chunks sent as silence because "
             "the agent had no audio ready."),
            ("late_packets", "agent_outbound_late_packets", "Outbound packets sent more than "
             "60 ms after the one before (the receiver hears a hole in the audio)."),
            ("fifo_trimmed_samples", "agent_caller_fifo_trimmed_samples", "Caller samples "
             "the inbound FIFO dropped to bound its delay (backlog or overflow)."),
        ):
            family = CounterMetricFamily(metric, help_text, labels=["transport"])
            for transport in sorted(per_transport):
                family.add_metric([transport], totals[(transport, name)])
            yield family
        yield from self._upstreams()
        counters = self.agent.ticker.counters
        late = CounterMetricFamily("agent_ticker_late_ticks",
                                   "Ticks that started more than one frame period late.",
                                   labels=["plugin"])
        late.add_metric([plugin], counters.late_ticks)
        yield late
        ticks = CounterMetricFamily("agent_ticker_ticks", "Batched plugin steps.",
                                    labels=["plugin"])
        ticks.add_metric([plugin], counters.ticks)
        yield ticks
        errors = CounterMetricFamily("agent_plugin_step_errors", "Plugin steps that raised.",
                                     labels=["plugin"])
        errors.add_metric([plugin], counters.step_errors)
        yield errors
