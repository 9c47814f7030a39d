"""A limit on concurrent unauthenticated connections per client address.

A connection counts against its address from the moment it is accepted until a request on it
passes authentication (`mark_authenticated`, called by the auth middleware; on a server
without keys every non-public request passes) or it closes. One address holding more than
`--max-unauthenticated-per-address` such connections has the next one closed at once,
before aiohttp sees it: no request head is read, no task is started for it.

With several workers the count is the server's, not each worker's: the gate counts each
address in the workers' shared tally (workers/tally.py), so one address holds at most N such
connections across every worker, handed-over connections included.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, cast

from aiohttp import web

log = logging.getLogger(__name__)

# A browser opens about six connections per host; an office behind one NAT address, or a
# bridge opening calls in a burst, many times that. Load tests from one address turn it off.
DEFAULT_PER_ADDRESS = 128


class SharedCount(Protocol):
    """Counts kept together with other processes (signaling/workers/tally.SharedTally)."""

    def take(self, key: int, limit: int, amount: int = 1) -> bool | None: ...

    def give_back(self, key: int, amount: int = 1) -> None: ...


class AddressGate:
    def __init__(self, per_address: int) -> None:
        self.per_address = per_address
        self.unauthenticated: Counter[str] = Counter()
        self.refused = 0
        self._connections: dict[int, GatedProtocol] = {}  # by id() of the inner handler
        self._shared: SharedCount | None = None
        self._shared_held: Counter[str] = Counter()  # connections counted in `_shared`
        self._key_of: Callable[[str], int] = lambda address: 0

    def share(self, shared: SharedCount | None, key_of: Callable[[str], int]) -> None:
        """Count against the server's limit in `shared` (several workers) from now on
        (None: no longer)."""
        self._shared, self._key_of = shared, key_of
        self._shared_held.clear()

    def admit(self, address: str) -> bool:
        if self.unauthenticated[address] >= self.per_address or not self._admit_shared(address):
            self.refused += 1
            return False
        self.unauthenticated[address] += 1
        return True

    def _admit_shared(self, address: str) -> bool:
        if self._shared is None:
            return True
        taken = self._shared.take(self._key_of(address), self.per_address)
        if taken:
            self._shared_held[address] += 1
        return taken is not False  # None: the shared table is full; this worker decides

    def forget(self, address: str) -> None:
        self.unauthenticated[address] -= 1
        if self.unauthenticated[address] <= 0:
            del self.unauthenticated[address]
        if self._shared is not None and self._shared_held[address] > 0:
            self._shared_held[address] -= 1
            if not self._shared_held[address]:
                del self._shared_held[address]
            self._shared.give_back(self._key_of(address))

    def track(self, handler: object, gated: GatedProtocol) -> None:
        self._connections[id(handler)] = gated

    def untrack(self, handler: object) -> None:
        self._connections.pop(id(handler), None)

    def authenticated(self, handler: object) -> None:
        gated = self._connections.get(id(handler))
        if gated is not None:
            gated.authenticated()


GATE: AddressGate | None = None  # the process's server gate, set by `gated_protocol_factory`


class GatedProtocol(asyncio.Protocol):
    """Stands in front of aiohttp's protocol for one connection: counts it, or refuses it."""

    def __init__(self, inner: asyncio.Protocol, gate: AddressGate) -> None:
        self.inner = inner
        self.gate = gate
        self.address: str | None = None  # set while the connection counts as unauthenticated
        self.refused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else "unknown"
        if not self.gate.admit(address):
            self.refused = True
            log.debug("refusing a connection from %s: %d unauthenticated already", address,
                      self.gate.per_address)
            # (typeshed types it a BaseTransport; a stream protocol is handed a Transport)
            cast(asyncio.Transport, transport).abort()
            return
        self.address = address
        self.gate.track(self.inner, self)
        self.inner.connection_made(transport)

    def authenticated(self) -> None:
        if self.address is not None:
            self.gate.forget(self.address)
            self.address = None

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.refused:
            return
        self.authenticated()  # stops counting either way
        self.gate.untrack(self.inner)
        self.inner.connection_lost(exc)


def new_gate(per_address: int) -> AddressGate | None:
    """The process's gate (None: no limit); every server of the process counts in it."""
    global GATE
    GATE = AddressGate(per_address) if per_address > 0 else None
    return GATE


def gated_protocol_factory(factory: Any, gate: AddressGate | None) -> Any:
    """Wrap a server's protocol factory so each connection passes the address gate."""
    if gate is None:
        return factory

    def make() -> asyncio.Protocol:
        return GatedProtocol(factory(), gate)

    return make


def mark_authenticated(request: web.Request) -> None:
    """This request's connection no longer counts as unauthenticated."""
    if GATE is not None and request.protocol is not None:
        GATE.authenticated(request.protocol)
