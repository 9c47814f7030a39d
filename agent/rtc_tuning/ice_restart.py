"""ICE restart (RFC 8445 section 2.4) on a live aiortc peer connection, DTLS kept.

aiortc 1.x has no ICE restart: an `RTCIceTransport` holds one aioice `Connection` for its
whole life, and its DTLS transport reads and writes through that connection's
`recv`/`send`. A restart here gives the ICE transport a fresh `Connection` (new local
ufrag/pwd, candidates gathered again, checks against the remote's new credentials) while
the DTLS transport above it, with its SRTP keys, SCTP association and RTP state, carries
on over whichever connection is current:

- `_recv`/`_send` of the ICE transport (what DTLS calls) are replaced by methods that go to
  the current connection. While there is no usable path (consent lost, or a restart not
  yet connected) sends are dropped, as a broken network would drop them, and receives
  wait for the next path instead of failing (a failure would end DTLS and the call).
- aiortc's `_monitor` (which turns the end of the one connection into a permanent
  "failed") is replaced by one that follows the current connection: a connection that
  ends by itself (RFC 7675 consent expired, aioice closes it after 30 s without answers)
  marks the transport "failed" until a restart connects; a replaced connection's end is
  expected and ignored.
- Make-before-break: the old connection keeps carrying media until the new one has a
  nominated pair; then the new one becomes current and the old one is closed.

aiortc 1.x has no ICE restart and no maintained library adds one to it,
hence the surgery, kept here with `missing_restart_internals()`, the start-up check of the
aiortc/aioice code it relies on. Works for either ICE role, so a test caller (controlling)
can restart with the same class.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aioice import Connection
from aioice.ice import ConnectionClosed
from aiortc import RTCIceCandidate, RTCIceTransport, RTCPeerConnection
from aiortc.rtcdtlstransport import RTCDtlsTransport
from aiortc.rtcicetransport import candidate_from_aioice, candidate_to_aioice
from aiortc.sdp import candidate_from_sdp, candidate_to_sdp

from agent.errors import CallError
from agent.rtc_tuning.source_check import source_of
from agent.task_owner import TaskOwner

log = logging.getLogger(__name__)

_SET_STATE = "_RTCIceTransport__setState"
# A restart with no remote candidate and no check from the remote yet is given this long.
RESTART_WAIT_SECONDS = 30.0
CANDIDATE_POLL_SECONDS = 0.02


class IceRestartError(CallError):
    """An ICE restart that cannot be done (coded; a 4xx for the client)."""


@dataclass(frozen=True)
class IceCredentials:
    ufrag: str
    pwd: str


@dataclass
class LocalIce:
    """The agent's side of an ICE generation: what a restart answers with."""

    credentials: IceCredentials
    candidates: list[RTCIceCandidate] = field(default_factory=list)


def ice_transports(pc: RTCPeerConnection) -> list[RTCIceTransport]:
    """The distinct ICE transports of `pc` (one when everything is BUNDLEd)."""
    found: list[RTCIceTransport] = []
    transports: list[RTCDtlsTransport] = [
        t.receiver.transport for t in pc.getTransceivers()
        if getattr(t.receiver, "transport", None) is not None]
    if pc.sctp is not None:
        transports.append(pc.sctp.transport)
    for dtls in transports:
        if dtls.transport not in found:
            found.append(dtls.transport)
    return found


def _usable(connection: Connection) -> bool:
    """The connection has a nominated pair to carry data."""
    return bool(getattr(connection, "_nominated", None))


class RestartableIce:
    """One ICE transport whose aioice connection can be replaced (see the module doc)."""

    def __init__(self, transport: RTCIceTransport) -> None:
        self.transport = transport
        self.generation = 0
        self.restarts_completed = 0
        self.last_received_at: float | None = None
        self._pending: Connection | None = None
        self._changed = asyncio.Event()
        self._closing = False
        self._tasks = TaskOwner("ice-restart")
        # (instance attributes shadowing aiortc's: what DTLS and start() look up)
        transport._recv = self._recv
        transport._send = self._send
        transport._monitor = self._monitor  # type: ignore[method-assign]
        transport.on("statechange", self._on_transport_state)

    @classmethod
    def install(cls, pc: RTCPeerConnection) -> RestartableIce | None:
        """Make `pc`'s ICE transport restartable. Call once BUNDLE has settled its transports
        and before ICE starts: the answerer right after setRemoteDescription(offer), the
        offerer right after setRemoteDescription(answer) (aiortc starts ICE in a task that
        has not run yet). None when the call is not BUNDLEd on one transport or aiortc's
        internals changed."""
        transports = ice_transports(pc)
        if len(transports) != 1 or missing_restart_internals():
            return None
        if transports[0].state != "new":
            return None  # started already: aiortc's monitor is running
        return cls(transports[0])

    # -- what the DTLS transport calls --------------------------------------------------------

    @property
    def connection(self) -> Connection:
        connection: Connection = self.transport._connection
        return connection

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _recv(self) -> bytes:
        while True:
            changed = self._changed
            if self._closed:
                raise ConnectionError("the ICE transport is closed")
            connection = self.connection
            if _usable(connection):
                try:
                    data: bytes = await connection.recv()
                except ConnectionError:
                    pass  # that path ended: wait for the next one (or the close)
                else:
                    self.last_received_at = time.monotonic()
                    return data
                if self.connection is not connection:
                    continue  # replaced meanwhile: read the new one
            await changed.wait()

    async def _send(self, data: bytes) -> None:
        if self._closed:
            raise ConnectionError("the ICE transport is closed")
        try:
            await self.connection.send(data)
        except ConnectionError:
            pass  # no path now: dropped, as the network would while a restart runs

    @property
    def _closed(self) -> bool:
        return self._closing or self.transport.state == "closed"

    async def _monitor(self) -> None:
        while not self._closed:
            connection = self.connection
            changed = self._changed
            event = await connection.get_event()
            if self._closed:
                return
            if connection is not self.connection:
                continue  # a replaced connection's close: expected
            if event is None or isinstance(event, ConnectionClosed):
                # RFC 7675: consent expired (or the path failed); a restart may bring it back
                self._set_state("failed")
                if changed.is_set() or self.connection is not connection:
                    continue
                await changed.wait()

    def _set_state(self, state: str) -> None:
        getattr(self.transport, _SET_STATE)(state)

    def _on_transport_state(self) -> None:
        if self.transport.state == "closed" and not self._closing:
            self._closing = True
            self._notify()
            pending, self._pending = self._pending, None
            if pending is not None:
                self._tasks.spawn(pending.close(), "close-pending")

    # -- the restart ------------------------------------------------------------------------

    @property
    def remote_ufrag(self) -> str | None:
        """The remote ufrag of the newest generation (a pending restart's, else current)."""
        connection = self._pending or self.connection
        ufrag: str | None = connection.remote_username
        return ufrag

    @property
    def local(self) -> LocalIce:
        connection = self._pending or self.connection
        return LocalIce(
            IceCredentials(connection.local_username, connection.local_password),
            [candidate_from_aioice(c) for c in connection.local_candidates])

    @property
    def path_down(self) -> bool:
        """The transport is failed (consent expired, or no nominated pair)."""
        return self.transport.state == "failed" or (
            self.transport.state == "completed" and not _usable(self.connection))

    async def begin(self) -> LocalIce:
        """Start a new ICE generation: a fresh connection with new local credentials and its
        candidates gathered (the caller side sends these in its restart offer)."""
        if self._closed:
            raise IceRestartError("call_ended", "the call is ending", status=409)
        if self.transport.state in ("new", "checking"):
            # aiortc's own start() still runs its first checks on the first connection
            raise IceRestartError("ice_not_connected", "the call's ICE has not connected yet; "
                                  "trickle candidates instead", status=409)
        old = self.connection
        fresh = Connection(
            ice_controlling=old.ice_controlling,
            stun_server=old.stun_server, turn_server=old.turn_server,
            turn_username=old.turn_username, turn_password=old.turn_password,
            turn_ssl=old.turn_ssl, turn_transport=old.turn_transport,
            use_ipv4=old._use_ipv4, use_ipv6=old._use_ipv6,
            transport_policy=old._transport_policy)
        previous, self._pending = self._pending, fresh
        if previous is not None:
            await previous.close()  # a restart overtaken by a newer one
        try:
            await fresh.gather_candidates()
        except BaseException:
            if self._pending is fresh:
                self._pending = None
            await fresh.close()
            raise
        if self._pending is not fresh or self._closed:
            await fresh.close()
            raise IceRestartError("ice_restart_superseded",
                                  "a newer ICE restart or the hang-up came first", status=409)
        self.generation += 1
        return LocalIce(IceCredentials(fresh.local_username, fresh.local_password),
                        [candidate_from_aioice(c) for c in fresh.local_candidates])

    async def connect(self, remote: IceCredentials, candidates: Sequence[RTCIceCandidate],
                      ended: bool = False) -> None:
        """Give the pending generation the remote's credentials and candidates and start its
        checks; it becomes the call's path once a pair is nominated."""
        fresh = self._pending
        if fresh is None:
            raise IceRestartError("no_ice_restart", "no ICE restart is pending", status=409)
        fresh.remote_username = remote.ufrag
        fresh.remote_password = remote.pwd
        fresh.remote_is_lite = self.connection.remote_is_lite
        for candidate in candidates:
            await fresh.add_remote_candidate(candidate_to_aioice(candidate))
        if ended:
            await fresh.add_remote_candidate(None)
        self._tasks.spawn(self._connect(fresh), f"connect-{self.generation}")

    async def restart(self, remote: IceCredentials, candidates: Sequence[RTCIceCandidate],
                      ended: bool = False) -> LocalIce:
        """The answering side's restart: new local credentials, checks against the remote's
        new ones; returns what to answer with."""
        local = await self.begin()
        await self.connect(remote, candidates, ended)
        return local

    async def add_remote_candidate(self, candidate: RTCIceCandidate | None) -> None:
        """A candidate trickled for the newest generation (None: end-of-candidates)."""
        connection = self._pending or self.connection
        if candidate is None:
            await connection.add_remote_candidate(None)
        else:
            await connection.add_remote_candidate(candidate_to_aioice(candidate))

    async def _connect(self, fresh: Connection) -> None:
        # aioice's connect() fails at once with nothing to check, so a restart whose offer
        # carried no candidates waits for a trickled one or the remote's first check.
        waited = 0.0
        while not (fresh._remote_candidates or fresh._early_checks):
            if waited >= RESTART_WAIT_SECONDS or self._pending is not fresh:
                if self._pending is fresh:
                    self._pending = None
                await fresh.close()
                return
            await asyncio.sleep(CANDIDATE_POLL_SECONDS)
            waited += CANDIDATE_POLL_SECONDS
        try:
            await fresh.connect()
        except ConnectionError:
            log.info("ICE restart generation %d failed", self.generation)
            if self._pending is fresh:
                self._pending = None
            await fresh.close()
            return
        if self._pending is not fresh or self._closed:
            await fresh.close()
            return
        self._pending = None
        old = self.connection
        self.transport._connection = fresh
        self.transport.iceGatherer._connection = fresh
        self.transport.iceGatherer._remote_candidates_end = False
        self.restarts_completed += 1
        self._notify()
        self._set_state("completed")
        await old.close()

    async def close(self) -> None:
        """Stop any restart in progress (the transport's own stop closes the current one)."""
        self._closing = True
        self._notify()
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending.close()
        for task in self._tasks.cancel_all():
            await asyncio.gather(task, return_exceptions=True)


def missing_restart_internals() -> list[str]:
    """What of aiortc/aioice the ICE restart relies on is gone (empty: all there)."""
    return list(_missing_restart_internals())


@functools.cache
def _missing_restart_internals() -> tuple[str, ...]:
    missing = []
    init = source_of(RTCIceTransport.__init__)
    if "self._connection = gatherer._connection" not in init or "self._recv" not in init:
        missing.append("RTCIceTransport._connection/_recv/_send (ICE restart unavailable)")
    start = source_of(RTCIceTransport.start)
    if "self._monitor()" not in start:
        missing.append("RTCIceTransport.start → _monitor (ICE restart unavailable)")
    if not hasattr(RTCIceTransport, _SET_STATE):
        missing.append("RTCIceTransport.__setState (ICE restart unavailable)")
    dtls = source_of(RTCDtlsTransport)
    if "self.transport._recv()" not in dtls or "self.transport._send(" not in dtls:
        missing.append("RTCDtlsTransport via transport._recv/_send (ICE restart unavailable)")
    for name in ("_nominated", "_use_ipv4", "_use_ipv6", "_transport_policy",
                 "_remote_candidates", "_early_checks"):
        if name not in source_of(Connection.__init__):
            missing.append(f"aioice Connection.{name} (ICE restart unavailable)")
    if not all(hasattr(Connection, n) for n in ("get_event", "gather_candidates", "connect")):
        missing.append("aioice Connection API (ICE restart unavailable)")
    return tuple(missing)


# -- the SDP text of a restart ----------------------------------------------------------------


@dataclass
class OfferedIce:
    """The ICE and DTLS parts of a (re-)offer, read from its text."""

    credentials: IceCredentials | None
    fingerprints: frozenset[str]
    mids: list[str]
    candidates: list[RTCIceCandidate]
    ended: bool


def _value(line: str, prefix: str) -> str | None:
    return line[len(prefix):].strip() if line.startswith(prefix) else None


def read_offered_ice(sdp: str) -> OfferedIce:
    """ICE credentials (the first ones given), DTLS fingerprints, mids and candidates of an
    SDP. IceRestartError (400 invalid_candidate) for a candidate line aiortc cannot read."""
    ufrag = pwd = None
    fingerprints: set[str] = set()
    mids: list[str] = []
    candidates: list[RTCIceCandidate] = []
    ended = False
    mid: str | None = None
    index = -1
    for raw in sdp.splitlines():
        line = raw.strip()
        if line.startswith("m="):
            index += 1
            mid = None
        elif (value := _value(line, "a=mid:")) is not None:
            mid = value
            mids.append(value)
            for candidate in candidates:
                if candidate.sdpMLineIndex == index:
                    candidate.sdpMid = value
        elif (value := _value(line, "a=ice-ufrag:")) is not None:
            ufrag = ufrag or value
        elif (value := _value(line, "a=ice-pwd:")) is not None:
            pwd = pwd or value
        elif (value := _value(line, "a=fingerprint:")) is not None:
            fingerprints.add(value.lower())
        elif (value := _value(line, "a=candidate:")) is not None and index >= 0:
            try:
                candidate = candidate_from_sdp(value)
            except (AssertionError, ValueError, IndexError):
                raise IceRestartError("invalid_candidate",
                                      f"bad candidate line: {value[:80]!r}") from None
            candidate.sdpMid = mid
            candidate.sdpMLineIndex = index
            candidates.append(candidate)
        elif line == "a=end-of-candidates":
            ended = True
    credentials = IceCredentials(ufrag, pwd) if ufrag and pwd else None
    return OfferedIce(credentials, frozenset(fingerprints), mids, candidates, ended)


def restart_sdpfrag(local: LocalIce, mid: str) -> str:
    """The `application/trickle-ice-sdpfrag` answer to a restart PATCH (RFC 9725 section
    4.4): the new credentials and every candidate (all gathered), on the BUNDLE's first
    media section."""
    lines = [f"a=ice-ufrag:{local.credentials.ufrag}", f"a=ice-pwd:{local.credentials.pwd}",
             "m=audio 9 UDP/TLS/RTP/SAVPF 0", f"a=mid:{mid}"]
    lines += [f"a=candidate:{candidate_to_sdp(c)}" for c in local.candidates]
    lines.append("a=end-of-candidates")
    return "\r\n".join(lines) + "\r\n"


def answer_with_ice(answer: str, local: LocalIce) -> str:
    """`answer` (an earlier answer of the same call) with the new generation's credentials
    and candidates in every media section; the default address (`m=` port, `c=`) follows the
    first candidate. Everything else, the DTLS fingerprint and role included, is unchanged."""
    newline = "\r\n" if "\r\n" in answer else "\n"
    first = local.candidates[0] if local.candidates else None
    out: list[str] = []
    for line in answer.split(newline):
        if line.startswith(("a=candidate:", "a=end-of-candidates")):
            continue
        if line.startswith("a=ice-ufrag:"):
            out += [f"a=candidate:{candidate_to_sdp(c)}" for c in local.candidates]
            out.append("a=end-of-candidates")
            line = f"a=ice-ufrag:{local.credentials.ufrag}"
        elif line.startswith("a=ice-pwd:"):
            line = f"a=ice-pwd:{local.credentials.pwd}"
        elif first is not None and line.startswith("m="):
            fields = line.split(" ")
            if len(fields) > 2 and fields[1] != "0":
                fields[1] = str(first.port)
                line = " ".join(fields)
        elif first is not None and line.startswith("c=IN IP"):
            family = "6" if ":" in first.ip else "4"
            line = f"c=IN IP{family} {first.ip}"
        out.append(line)
    return newline.join(out)
