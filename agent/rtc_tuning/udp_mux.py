"""`--rtc-udp-port PORT`: every call's ICE, DTLS and SRTP on one UDP socket per address.

aioice gives each host candidate a socket of its own (`Connection.get_component_candidates`
binds `loop.create_datagram_endpoint(..., local_addr=(address, 0))` with a `StunProtocol`).
While that method runs (a context variable marks it, as in `port_range.py`), the loop's
`create_datagram_endpoint` is wrapped so such a bind gets instead a `MuxedTransport`: a
virtual datagram transport on the shared socket of that address, handed to aioice's own
`StunProtocol`. aioice then works unchanged: its host candidate carries the shared socket's
address and port, and `--rtc-advertise` rewrites the address only, so the advertised port is
the mux port.

The shared socket (`MuxSocket`) demultiplexes as Pion's and LiveKit's UDP mux do:

- a datagram from a *validated* remote address goes to the call that address belongs to
  (one dict look-up: the path every DTLS and SRTP packet takes);
- a STUN Binding request goes to the call whose local ufrag begins its USERNAME, and only
  when its MESSAGE-INTEGRITY verifies with that call's password; the remote address is then
  validated for that call (an authenticated ICE check succeeded from it);
- a STUN response goes to the call that sent the request with that transaction id, when it
  comes from the address the request went to; a verified success response validates it too;
- everything else from an unvalidated address (DTLS, SRTP, a check with a wrong password) is
  dropped: a spoofed packet for a live call has no effect until ICE succeeds from its source.

A check naming an unknown ufrag is held in a bounded table of pending entries (oldest
evicted, expired after a few seconds) and replayed if a call with that ufrag registers in
time (a check racing its call's registration); it is never answered. Everything that is not
from a validated address passes a token bucket first, so a flood of unknown usernames from
many addresses costs a bounded amount of work and leaves the live calls' packets, which never
touch the bucket, alone. A call's ufrag, routes and pending transactions are removed when
aioice closes its transport (the call ended).

Hand-written because no maintained Python library muxes aioice (Pion's and LiveKit's muxes
are Go, inside their ICE agents), and the shared socket is read with `loop.add_reader` and a
`recvfrom` loop: asyncio's datagram transport reads one datagram per event-loop iteration,
which for one socket carrying every call would cost a loop iteration (and an epoll call) per
packet. One process only: `--workers` >1 would need the kernel to steer each caller to the
worker owning its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import ipaddress
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aioice import stun

from agent.rtc_tuning.source_check import source_of

log = logging.getLogger(__name__)

STUN_COOKIE = b"\x21\x12\xa4\x42"
BINDING_REQUEST = b"\x00\x01"
READ_BATCH = 64  # datagrams read per readiness event before yielding to the loop
SOCKET_BUFFER = 4 * 1024 * 1024  # bytes: every call's packets wait in this one socket
MAX_DATAGRAM = 65535
Address = tuple[str, int]


@dataclass(frozen=True)
class MuxLimits:
    """The bounds that keep unauthenticated traffic from costing more than a little."""

    pending_entries: int = 1024  # held checks with an unknown ufrag
    pending_seconds: float = 5.0  # how long one is held
    slow_rate: float = 2000.0  # packets/s from unvalidated addresses that are looked at
    slow_burst: float = 400.0
    transactions: int = 8192  # outgoing STUN requests awaiting their response
    routes_per_call: int = 8  # validated remote addresses one call may have


@dataclass
class MuxStats:
    """Counts of what the socket did with the datagrams it received."""

    routed: int = 0  # to a call, by validated address
    checks: int = 0  # authenticated checks delivered (address validated)
    responses: int = 0  # responses delivered to the call that asked
    unrouted: int = 0  # non-STUN from an unvalidated address: dropped
    bad_integrity: int = 0  # a known ufrag, a wrong password: dropped
    unknown_username: int = 0  # held as pending (or dropped)
    rate_limited: int = 0  # over the token bucket: dropped unread
    malformed: int = 0
    pending_replayed: int = 0
    send_errors: int = 0


class TokenBucket:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


@dataclass
class _Pending:
    ufrag: str
    data: bytes
    at: float


class MuxedTransport(asyncio.DatagramTransport):
    """One call's host candidate on a shared socket: what aioice's `StunProtocol` sends and
    closes through."""

    def __init__(self, mux: MuxSocket, protocol: asyncio.DatagramProtocol,
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.mux = mux
        self.protocol = protocol
        self.loop = loop
        self.routes: list[Address] = []  # validated remote addresses, oldest first
        self.ufrag: str = ""
        self._closing = False

    @property
    def connection(self) -> Any:
        """The aioice `Connection` this candidate belongs to (the protocol's `receiver`)."""
        return getattr(self.protocol, "receiver", None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "sockname":
            return self.mux.sockname
        return default  # no "socket": the shared one is tuned once, not per call

    def sendto(self, data: Any, addr: Any = None) -> None:
        if self._closing or addr is None:
            return
        self.mux.send(self, bytes(data), (addr[0], addr[1]))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.mux.unregister(self)
        self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    def get_write_buffer_size(self) -> int:
        return 0


def _stun_class(data: bytes) -> int:
    """0 request, 1 indication, 2 success response, 3 error response (RFC 8489 §5)."""
    kind = int.from_bytes(data[0:2], "big")
    return ((kind >> 7) & 2) | ((kind >> 4) & 1)


def _is_stun(data: bytes) -> bool:
    return len(data) >= 20 and data[0] < 2 and data[4:8] == STUN_COOKIE


class MuxSocket:
    """The one UDP socket of an address, and the tables that route its datagrams."""

    def __init__(self, address: str, port: int, limits: MuxLimits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            sock.bind((address, port))
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.sock = sock
        self.sockname: Address = sock.getsockname()[:2]
        self.limits = limits or MuxLimits()
        self.stats = MuxStats()
        self._clock = clock
        self._bucket = TokenBucket(self.limits.slow_rate, self.limits.slow_burst, clock)
        self.routes: dict[Address, MuxedTransport] = {}
        self.ufrags: dict[str, list[MuxedTransport]] = {}
        self.pending: OrderedDict[Address, _Pending] = OrderedDict()
        self.sent: OrderedDict[bytes, tuple[MuxedTransport, Address]] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the socket ------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the socket on `loop` (idempotent; moves to a new loop if the old one closed)."""
        if self._loop is loop:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        loop.add_reader(self.sock.fileno(), self._read_ready)
        self._loop = loop

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self._loop = None
        self.sock.close()

    def _read_ready(self) -> None:
        for _ in range(READ_BATCH):
            try:
                data, addr = self.sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # e.g. an ICMP error queued on the socket: the next datagram
            try:
                self.datagram_received(data, (addr[0], addr[1]))
            except Exception:  # one call's failure must not stop the others' datagrams
                log.warning("datagram from %s on %s:%d failed", addr[0], *self.sockname,
                            exc_info=True)

    def send(self, transport: MuxedTransport, data: bytes, addr: Address) -> None:
        if data[0:2] == BINDING_REQUEST and _is_stun(data):
            self._remember_request(data[8:20], transport, addr)
        try:
            self.sock.sendto(data, addr)
        except (BlockingIOError, InterruptedError):
            self.stats.send_errors += 1  # a full send buffer drops the datagram, as UDP may
        except OSError as exc:
            self.stats.send_errors += 1
            transport.protocol.error_received(exc)

    # -- calls -----------------------------------------------------------------------------

    def register(self, transport: MuxedTransport) -> None:
        """A call's candidate on this socket, found by its local ufrag from now on."""
        connection = transport.connection
        transport.ufrag = str(getattr(connection, "local_username", ""))
        self.ufrags.setdefault(transport.ufrag, []).append(transport)
        held = [addr for addr, entry in self.pending.items() if entry.ufrag == transport.ufrag]
        for addr in held:
            entry = self.pending.pop(addr)
            if self._clock() - entry.at <= self.limits.pending_seconds:
                self.stats.pending_replayed += 1
                self._check(entry.data, addr, self.routes.get(addr))

    def unregister(self, transport: MuxedTransport) -> None:
        """The call ended: its ufrag, routes and awaited responses go."""
        same = self.ufrags.get(transport.ufrag, [])
        if transport in same:
            same.remove(transport)
        if not same:
            self.ufrags.pop(transport.ufrag, None)
        for addr in transport.routes:
            if self.routes.get(addr) is transport:
                del self.routes[addr]
        transport.routes.clear()
        for tid in [tid for tid, (owner, _) in self.sent.items() if owner is transport]:
            del self.sent[tid]

    @property
    def calls(self) -> int:
        return sum(len(transports) for transports in self.ufrags.values())

    def _route(self, addr: Address, transport: MuxedTransport) -> None:
        previous = self.routes.get(addr)
        if previous is transport:
            return
        if previous is not None:
            previous.routes.remove(addr)
        self.routes[addr] = transport
        transport.routes.append(addr)
        if len(transport.routes) > self.limits.routes_per_call:
            oldest = transport.routes.pop(0)
            self.routes.pop(oldest, None)

    def _remember_request(self, tid: bytes, transport: MuxedTransport, addr: Address) -> None:
        self.sent[tid] = (transport, addr)
        self.sent.move_to_end(tid)
        while len(self.sent) > self.limits.transactions:
            self.sent.popitem(last=False)

    # -- receiving -------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: Address) -> None:
        routed = self.routes.get(addr)
        if not _is_stun(data):
            if routed is None:
                self.stats.unrouted += 1  # DTLS/SRTP from an address no check validated
                return
            self.stats.routed += 1
            routed.protocol.datagram_received(data, addr)
            return
        kind = _stun_class(data)
        if kind == 0:
            self._check(data, addr, routed)
        elif kind >= 2:
            self._response(data, addr, routed)

    def _slow_path_allowed(self) -> bool:
        if self._bucket.take():
            return True
        self.stats.rate_limited += 1
        return False

    def _parse(self, data: bytes) -> stun.Message | None:
        try:
            return stun.parse_message(data)
        except ValueError:
            self.stats.malformed += 1
            return None

    def _check(self, data: bytes, addr: Address, routed: MuxedTransport | None) -> None:
        if routed is None and not self._slow_path_allowed():
            return
        message = self._parse(data)
        if message is None or message.message_method != stun.Method.BINDING:
            return
        username = message.attributes.get("USERNAME")
        if not isinstance(username, str):
            self.stats.malformed += 1
            return
        ufrag = username.partition(":")[0]
        candidates = self.ufrags.get(ufrag)
        if not candidates:
            self._hold(ufrag, data, addr)
            return
        if routed is not None and routed in candidates:
            routed.protocol.datagram_received(data, addr)  # aioice verifies it as usual
            return
        if routed is not None and not self._slow_path_allowed():
            return  # a validated peer checking another call: as costly as a stranger
        for transport in candidates:
            password = getattr(transport.connection, "local_password", None)
            if password and message.check_message_integrity(password.encode("utf8")):
                self.stats.checks += 1
                self._route(addr, transport)
                transport.protocol.datagram_received(data, addr)
                return
        self.stats.bad_integrity += 1

    def _hold(self, ufrag: str, data: bytes, addr: Address) -> None:
        self.stats.unknown_username += 1
        now = self._clock()
        while self.pending:
            oldest = next(iter(self.pending.values()))
            if now - oldest.at <= self.limits.pending_seconds:
                break
            self.pending.popitem(last=False)
        self.pending.pop(addr, None)
        self.pending[addr] = _Pending(ufrag, data, now)
        while len(self.pending) > self.limits.pending_entries:
            self.pending.popitem(last=False)

    def _response(self, data: bytes, addr: Address, routed: MuxedTransport | None) -> None:
        if routed is None and not self._slow_path_allowed():
            return
        tid = data[8:20]
        awaited = self.sent.get(tid)
        if awaited is None or awaited[1] != addr:
            self.stats.unrouted += 1  # no request of ours went there with that id
            return
        del self.sent[tid]
        transport = awaited[0]
        if routed is not transport and _stun_class(data) == 2:
            message = self._parse(data)
            password = getattr(transport.connection, "remote_password", None)
            if (message is not None and password
                    and message.check_message_integrity(password.encode("utf8"))):
                self._route(addr, transport)  # our check succeeded: the peer is there
        self.stats.responses += 1
        transport.protocol.datagram_received(data, addr)


class UdpMux:
    """`--rtc-udp-port`: the shared socket of each host address, all on one port."""

    def __init__(self, port: int, sockets: dict[str, MuxSocket]) -> None:
        self.port = port
        self.sockets = sockets

    @classmethod
    def open(cls, port: int, addresses: Iterable[str],
             limits: MuxLimits | None = None) -> UdpMux:
        """Bind `port` on every address (OSError names the address that failed; nothing
        stays bound then)."""
        sockets: dict[str, MuxSocket] = {}
        try:
            for address in addresses:
                try:
                    sockets[address] = MuxSocket(address, port, limits)
                except OSError as exc:
                    raise OSError(exc.errno, f"{address}:{port}: {exc.strerror}") from None
        except BaseException:
            for mux_socket in sockets.values():
                mux_socket.close()
            raise
        if port == 0 and sockets:
            port = next(iter(sockets.values())).sockname[1]
        return cls(port, sockets)

    @classmethod
    def open_on_host_addresses(cls, port: int) -> UdpMux:
        """Bind `port` on every address aioice gathers host candidates on (after
        `limit_host_addresses`)."""
        import aioice.ice

        return cls.open(port, aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True))

    def close(self) -> None:
        for mux_socket in self.sockets.values():
            mux_socket.close()

    def stats(self) -> dict[str, Any]:
        """Per address: calls registered, validated routes, pending entries, counters."""
        return {address: {"calls": s.calls, "routes": len(s.routes),
                          "pending": len(s.pending), **vars(s.stats)}
                for address, s in self.sockets.items()}


def parse_udp_port(text: str) -> int:
    """ "40000" → 40000; ValueError says what is wrong."""
    try:
        port = int(text.strip())
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r} is not a UDP port (1-65535)")
    return port


# -- wiring into aioice -------------------------------------------------------------------------

_GATHERING: contextvars.ContextVar[bool] = contextvars.ContextVar("rtc_mux_gathering",
                                                                  default=False)
_OUTSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar("rtc_mux_outside",
                                                                default=False)
_mux: UdpMux | None = None
_original_get_component_candidates: Any = None
_WRAPPED_MARK = "_rtc_udp_mux_wrapped"


@contextlib.contextmanager
def outside_mux() -> Iterator[None]:
    """Peer connections set up inside this block bind sockets of their own (a caller in the
    same process as the agent, in tests and benchmarks)."""
    token = _OUTSIDE.set(True)
    try:
        yield
    finally:
        _OUTSIDE.reset(token)


def _muxed_endpoint(mux: UdpMux, loop: asyncio.AbstractEventLoop, protocol_factory: Any,
                    address: str) -> tuple[MuxedTransport, asyncio.DatagramProtocol]:
    mux_socket = mux.sockets.get(address)
    if mux_socket is None:  # an address that appeared after start-up: aioice skips it
        raise OSError(errno.EADDRNOTAVAIL, f"no --rtc-udp-port socket on {address}")
    mux_socket.attach(loop)
    protocol = protocol_factory()
    transport = MuxedTransport(mux_socket, protocol, loop)
    protocol.connection_made(transport)
    mux_socket.register(transport)
    return transport, protocol


def _wrap_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Hand aioice's port-0 host binds made while it gathers to the mux."""
    if getattr(loop, _WRAPPED_MARK, False):
        return
    original = loop.create_datagram_endpoint

    async def create_datagram_endpoint(protocol_factory: Any, local_addr: Any = None,
                                       *args: Any, **kwargs: Any) -> Any:
        mux = _mux
        if (mux is None or not _GATHERING.get() or args or not isinstance(local_addr, tuple)
                or len(local_addr) != 2 or local_addr[1] != 0
                or kwargs.get("sock") is not None):
            return await original(protocol_factory, local_addr, *args, **kwargs)
        return _muxed_endpoint(mux, loop, protocol_factory, local_addr[0])

    # (the running loop's own method, replaced on that instance only)
    loop.create_datagram_endpoint = create_datagram_endpoint  # type: ignore[method-assign]
    setattr(loop, _WRAPPED_MARK, True)


def use_udp_mux(mux: UdpMux | None) -> bool:
    """Put every later call's host candidates on `mux` (None: sockets of their own again).

    Returns False (and changes nothing) when aioice's internals are not what this relies on.
    """
    global _mux, _original_get_component_candidates
    import aioice.ice

    if mux is not None and missing_mux_internals():
        return False
    _mux = mux
    if _original_get_component_candidates is not None:
        return True
    original = aioice.ice.Connection.get_component_candidates
    _original_get_component_candidates = original

    # (`wraps`: the start-up checks here and in port_range.py read aioice's own source)
    @functools.wraps(original)
    async def get_component_candidates(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _mux is None or _OUTSIDE.get():
            return await original(self, *args, **kwargs)
        _wrap_loop(asyncio.get_running_loop())
        token = _GATHERING.set(True)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _GATHERING.reset(token)

    # (a deliberate patch of aioice's method: mypy forbids assigning to methods)
    aioice.ice.Connection.get_component_candidates = (  # type: ignore[method-assign]
        get_component_candidates)
    return True


def missing_mux_internals() -> list[str]:
    """What of aioice the mux relies on is gone (empty: all there)."""
    import aioice.ice

    method = _original_get_component_candidates or getattr(
        aioice.ice.Connection, "get_component_candidates", None)
    needed = {
        "Connection.get_component_candidates binding host sockets with "
        "loop.create_datagram_endpoint(local_addr=(address, 0))": (
            method, ("asyncio.get_running_loop()", "loop.create_datagram_endpoint(",
                     "local_addr=(address, 0)", 'get_extra_info("sockname")')),
        "StunProtocol.receiver (the Connection a datagram is for)": (
            aioice.ice.StunProtocol.__init__, ("self.receiver = receiver",)),
        "Connection.remote_password (to verify the answers to its checks)": (
            aioice.ice.Connection.__init__, ("self.remote_password",)),
    }
    missing = []
    for what, (code, texts) in needed.items():
        source = source_of(code) if code is not None else ""
        if not all(text in source for text in texts):
            missing.append(f"aioice {what} (--rtc-udp-port cannot apply)")
    for name in ("local_username", "local_password"):
        if not isinstance(getattr(aioice.ice.Connection, name, None), property):
            missing.append(f"aioice Connection.{name} (--rtc-udp-port cannot apply)")
    return missing

