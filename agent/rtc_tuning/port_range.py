"""`--rtc-ports LOW-HIGH`: ICE host candidates bound only to UDP ports inside a range.

aioice binds each host candidate's socket to port 0 (any port) in
`Connection.get_component_candidates`, through the running loop's
`create_datagram_endpoint(..., local_addr=(address, 0))`, and offers no setting for it. While
that method runs (and only then: a context variable marks it), the loop's
`create_datagram_endpoint` is wrapped so a `local_addr` with port 0 is bound instead to a free
port of the range: a random start, then upwards with wrap-around, skipping ports in use (by
other calls, other workers or anything else). When none is free the call is refused with a
coded 503 (`rtc_ports_exhausted`) before its answer exists. STUN and TURN sockets
(`remote_addr`, no `local_addr`) are left alone.

Process-wide, like `limit_host_addresses`. `missing_port_internals()` is the start-up check
of the aioice code this relies on.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import CallError
from agent.rtc_tuning.source_check import source_of

log = logging.getLogger(__name__)

MAX_PORT = 65535


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    @property
    def size(self) -> int:
        return self.high - self.low + 1

    def __contains__(self, port: object) -> bool:
        return isinstance(port, int) and self.low <= port <= self.high

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"

    def search_order(self) -> list[int]:
        """Every port of the range, from a random one upwards, wrapping around."""
        start = random.randrange(self.size)
        return [self.low + (start + i) % self.size for i in range(self.size)]


def parse_port_range(text: str) -> PortRange:
    """ "40000-40099" → PortRange(40000, 40099); ValueError says what is wrong."""
    low_text, sep, high_text = text.strip().partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low = high = -1
    if not sep or low < 1 or high > MAX_PORT or low > high:
        raise ValueError(f"{text!r} is not a UDP port range LOW-HIGH with "
                         f"1 <= LOW <= HIGH <= {MAX_PORT}")
    return PortRange(low, high)


def ports_needed(max_calls: int, host_addresses: int) -> int:
    """One port per host address per call (audio and data channel BUNDLEd on one ICE
    transport, as browsers and aiortc offer)."""
    return max_calls * max(1, host_addresses)


def host_address_count() -> int:
    """How many addresses aioice gathers host candidates on (after `limit_host_addresses`)."""
    import aioice.ice

    return len(aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True))


class RtcPortsExhausted(CallError):
    def __init__(self, ports: PortRange) -> None:
        super().__init__("rtc_ports_exhausted",
                         f"every UDP port of --rtc-ports {ports} is in use; retry later",
                         status=503)


_ACTIVE: contextvars.ContextVar[_Gathering | None] = contextvars.ContextVar(
    "rtc_port_gathering", default=None)
_range: PortRange | None = None
_original_get_component_candidates: Any = None
_WRAPPED_MARK = "_rtc_ports_wrapped"


@dataclass
class _Gathering:
    ports: PortRange
    transports: list[asyncio.BaseTransport]


async def _bind_in_range(original: Callable[..., Awaitable[Any]], gathering: _Gathering,
                         protocol_factory: Any, address: str, kwargs: dict[str, Any]) -> Any:
    for port in gathering.ports.search_order():
        try:
            result = await original(protocol_factory, local_addr=(address, port), **kwargs)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                continue  # another call, another worker, or something else holds it
            raise  # e.g. an address not on this host: aioice skips that address
        gathering.transports.append(result[0])
        return result
    raise RtcPortsExhausted(gathering.ports)


def _wrap_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Route the loop's port-0 UDP binds made while aioice gathers into the range."""
    if getattr(loop, _WRAPPED_MARK, False):
        return
    original = loop.create_datagram_endpoint

    async def create_datagram_endpoint(protocol_factory: Any, local_addr: Any = None,
                                       *args: Any, **kwargs: Any) -> Any:
        gathering = _ACTIVE.get()
        if (gathering is None or args or not isinstance(local_addr, tuple)
                or len(local_addr) != 2 or local_addr[1] != 0
                or kwargs.get("sock") is not None):
            return await original(protocol_factory, local_addr, *args, **kwargs)
        return await _bind_in_range(original, gathering, protocol_factory, local_addr[0],
                                    kwargs)

    # (the running loop's own method, replaced on that instance only)
    loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign]
    setattr(loop, _WRAPPED_MARK, True)


def limit_host_ports(ports: PortRange | None) -> bool:
    """Bind ICE host candidates only inside `ports` (None: any port, aioice's default).

    Returns False (and changes nothing) when aioice's internals are not what this relies on.
    """
    global _range, _original_get_component_candidates
    import aioice.ice

    if missing_port_internals():
        return False
    _range = ports
    if _original_get_component_candidates is not None:
        return True  # installed already; the range just changed
    original = aioice.ice.Connection.get_component_candidates
    _original_get_component_candidates = original

    async def get_component_candidates(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _range is None:
            return await original(self, *args, **kwargs)
        _wrap_loop(asyncio.get_running_loop())
        gathering = _Gathering(_range, [])
        token = _ACTIVE.set(gathering)
        try:
            return await original(self, *args, **kwargs)
        except BaseException:
            # aioice keeps a host socket only once the whole method returns: close the ones
            # bound before the range ran out, or they would leak with their ports.
            for transport in gathering.transports:
                transport.close()
            raise
        finally:
            _ACTIVE.reset(token)

    # (a deliberate patch of aioice's method: mypy forbids assigning to methods)
    aioice.ice.Connection.get_component_candidates = (  # type: ignore[method-assign]
        get_component_candidates)
    return True


def missing_port_internals() -> list[str]:
    """What of aioice the port range relies on is gone (empty: all there)."""
    import aioice.ice

    method = getattr(aioice.ice.Connection, "get_component_candidates", None)
    if method is None:
        return ["aioice Connection.get_component_candidates (--rtc-ports cannot apply)"]
    method = _original_get_component_candidates or method  # aioice's own, once wrapped
    source = source_of(method)
    if not source:
        return ["aioice Connection.get_component_candidates source (--rtc-ports cannot apply)"]
    needed = ("asyncio.get_running_loop()", "loop.create_datagram_endpoint(",
              "local_addr=(address, 0)")
    if not all(text in source for text in needed):
        return ["aioice Connection.get_component_candidates no longer binds host sockets "
                "with loop.create_datagram_endpoint(local_addr=(address, 0)) "
                "(--rtc-ports cannot apply)"]
    return []
