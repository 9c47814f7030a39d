"""The node registry: this node's heartbeat, and the node table every request routes by.

Every `heartbeat_s` each worker of a node sends one script (scripts.SYNC): the node's record
(address, serving/draining, capacity, its ICE/RTP addresses), the calls this worker holds
(refreshed, so they outlive the TTL only while the node lives; ended ones removed) and back
the whole table.
Between heartbeats the worker watches its own legs every `WATCH_S` and sends only what
changed, so a hung-up call frees its cluster slot within that, and a drain leaves
placement at once. The table is kept here: forwarding reads it, never Redis, so the calls
of live nodes stay controllable while Redis is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.media_agent import MediaAgent
from agent.worker_tag import TAGS
from signaling.auth import Principal
from signaling.cluster.settings import ClusterSettings
from signaling.cluster.store import Store, StoreDown

log = logging.getLogger(__name__)

WATCH_S = 0.25


@dataclass(frozen=True)
class NodeInfo:
    tag: str
    address: str
    state: str  # starting | serving | draining
    capacity: int  # 0: no limit
    calls: int  # calls held and slots placed there
    media: dict[str, Any] = field(default_factory=dict)  # its ICE/RTP addresses (media_record)
    sip: bool = False  # it serves SIP: outbound SIP calls are placed there


def _media(value: object) -> dict[str, Any]:
    try:
        media = json.loads(str(value or "{}"))
    except ValueError:
        return {}
    return media if isinstance(media, dict) else {}


@dataclass
class NodeTable:
    """The nodes as last read from Redis (kept as they were while Redis is down)."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    read_at: float = 0.0  # time.monotonic() of the last good read

    def update(self, rows: Any) -> None:
        rows = rows if isinstance(rows, list) else []  # an empty Lua table encodes as {}
        self.nodes = {str(r[0]): NodeInfo(str(r[0]), str(r[1]), str(r[2] or ""), int(r[3]),
                                          int(r[4]), _media(r[5] if len(r) > 5 else None),
                                          len(r) > 6 and str(r[6]) == "1")
                      for r in rows}
        self.read_at = time.monotonic()

    def count(self, state: str) -> float:
        """Nodes in `state` (/metrics)."""
        return float(sum(node.state == state for node in self.nodes.values()))

    def address_of(self, tag: str) -> str | None:
        node = self.nodes.get(tag)
        return None if node is None else node.address

    def view(self) -> list[dict[str, Any]]:
        return [{"node": n.tag, "address": n.address, "state": n.state,
                 "capacity": n.capacity, "calls": n.calls, "media": n.media, "sip": n.sip}
                for n in sorted(self.nodes.values(), key=lambda n: n.tag)]


def tenant_name(tenant: str | None) -> str:
    """A tenant as the cluster's keys name it (an open server's anonymous callers: open)."""
    return "open" if tenant is None else tenant


def tenant_of_leg(owner: object) -> str:
    """The tenant a leg counts against ('' where none: counted for the node only)."""
    return tenant_name(owner.tenant) if isinstance(owner, Principal) else ""


class Heartbeat:
    """This worker's part of the node's record and calls in Redis."""

    def __init__(self, settings: ClusterSettings, store: Store, agent: MediaAgent, tag: str,
                 workers: int, table: NodeTable, media: dict[str, Any] | None = None,
                 pending: Callable[[], Mapping[str, object]] | None = None,
                 sip: bool | None = None) -> None:
        self.settings, self.store, self.agent = settings, store, agent
        # calls holding a slot without a leg (ringing outbound SIP calls): id -> owner
        self.pending = pending or dict
        # this node serves SIP (None: another worker of the node says so, not this one)
        self.sip = sip
        self.tag, self.workers, self.table = tag, workers, table
        self.media = json.dumps(media or {}, sort_keys=True)  # this node's, as its record has it
        self.published: dict[str, str] = {}  # call id -> tenant, as Redis has it
        self._state_sent = ""
        self._next_beat = 0.0
        self.beats = 0  # answered syncs
        self.syncs = 0  # syncs sent (Redis round trips of the registry)

    def state(self) -> str:
        return "draining" if self.agent.draining else "serving"

    def _live(self) -> dict[str, str]:
        """The calls this worker holds: its legs and its calls without a leg yet."""
        live = {call: tenant_of_leg(owner) for call, owner in self.pending().items()}
        live.update((leg.id, tenant_of_leg(leg.owner)) for leg in self.agent.legs)
        return live

    def _changes(self, full: bool) -> tuple[list[list[str]], list[list[str]]]:
        live = self._live()
        if full:
            add = [[call, tenant] for call, tenant in live.items()]
        else:
            add = [[call, tenant] for call, tenant in live.items() if call not in self.published]
        remove = [[call, tenant] for call, tenant in self.published.items() if call not in live]
        return add, remove

    async def beat(self, full: bool = True) -> bool:
        """One sync (a full one refreshes every call); False when Redis did not answer."""
        add, remove = self._changes(full)
        state = self.state()
        self.syncs += 1
        record: dict[str, Any] = {"address": self.settings.node_address, "state": state,
                                  "capacity": self.agent.capacity, "workers": self.workers,
                                  "media": self.media}
        if self.sip is not None:
            record["sip"] = "1" if self.sip else "0"
        try:
            rows = await self.store.run(
                "SYNC", node=self.tag, ttl=int(self.settings.ttl_s * 1000), tags=TAGS,
                record=record, add=add, remove=remove)
        except StoreDown:
            return False
        for call, tenant in add:
            self.published[call] = tenant
        for call, _ in remove:
            self.published.pop(call, None)
        self._state_sent = state
        self.table.update(rows)
        self.beats += 1
        return True

    async def send_state(self) -> None:
        """Tell the cluster now if this node started draining since the last sync."""
        if self.state() != self._state_sent and self.store.usable:
            await self.beat(full=False)

    async def send_changes(self) -> None:
        """Tell the cluster now of calls that started or ended since the last sync."""
        if self.store.usable and self._changed():
            await self.beat(full=False)

    def _changed(self) -> bool:
        if self.state() != self._state_sent:
            return True
        live = self._live()
        return len(self.published) != len(live) or any(
            call not in self.published for call in live)

    async def run(self) -> None:
        """Beat every heartbeat_s, and between beats whenever the calls or state change."""
        while True:
            now = time.monotonic()
            if now >= self._next_beat:
                self._next_beat = now + self.settings.heartbeat_s
                await self.beat(full=True)
            elif self.store.usable and self._changed():
                await self.beat(full=False)
            await asyncio.sleep(WATCH_S)

    async def leave(self) -> None:
        """This node is stopping: its calls are no longer held here."""
        try:
            await self.store.run("SYNC", node=self.tag, ttl=1, tags="",
                                 record={"address": self.settings.node_address,
                                         "state": "draining", "capacity": 0,
                                         "workers": self.workers, "media": self.media},
                                 add=[], remove=[[c, t] for c, t in self.published.items()])
        except StoreDown:
            pass
