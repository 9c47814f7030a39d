"""Requests between nodes, signed with the cluster secret (`--cluster-secret`), each good
once and only at the node it was signed for.

The same HMAC-SHA256 as the workers' private channel (signaling/workers/channel.py
`mac_of`), over the fields a node-to-node request must not have changed: the forwarding
node's tag, the tag of the node it is meant for, a timestamp, a random nonce, the method,
the raw path and query, the SHA-256 of the body, and the slot the forwarding node placed the
call in (if any). A request counts as a node's only with a right MAC, a timestamp within
MAX_AGE_S of now, this node's tag as its target, and a nonce not seen before: `NodeGate`
remembers each nonce until its timestamp is stale (in Redis, `SET NX` with that expiry,
shared by every node and worker; and in a bounded table of this process, which alone
decides while Redis is down). A client, which never sees the secret, cannot make one, and
the headers of a client that sends them are dropped before anything is relayed; a captured
request replayed is refused (409 `node_request_replayed`), and one sent to another node
than the one it was signed for too (421 `node_misdirected`: the forwarding node then treats
that address as not the node's).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from multidict import CIMultiDictProxy

from signaling.errors import ApiError
from signaling.workers.channel import MAX_AGE_S, mac_of

FROM_HEADER = "X-Agent-Node-Forwarded"
SIGNATURE_HEADER = "X-Agent-Node-Signature"
PLACED_HEADER = "X-Agent-Node-Placed"  # the slot the forwarding node took for a new call
NODE_HEADERS = frozenset(h.lower() for h in (FROM_HEADER, SIGNATURE_HEADER, PLACED_HEADER))
MISDIRECTED = 421  # the status of a request signed for another node
MAX_NONCE_CHARS = 64
LOCAL_NONCES = 100_000  # nonces one process remembers at most (oldest forgotten first)


@dataclass(frozen=True)
class Signed:
    """A rightly signed request: who sent it, its nonce, and when its signature goes stale
    (epoch seconds)."""

    sender: str
    nonce: str
    stale_at: float


def refused(message: str) -> ApiError:
    return ApiError("node_signature_invalid", message, status=403)


@dataclass(frozen=True)
class NodeSigner:
    tag: str  # this node's
    secret: bytes = field(repr=False)
    clock: Callable[[], float] = time.time  # epoch seconds (tests give their own)

    def _mac(self, sender: str, to: str, stamp: str, nonce: str, method: str, raw_path: str,
             body: bytes, placed: str) -> str:
        return mac_of(self.secret, "node/2", sender, to, stamp, nonce, method, raw_path,
                      hashlib.sha256(body).hexdigest(), placed)

    def sign(self, method: str, raw_path: str, body: bytes, *, to: str,
             placed: str = "") -> dict[str, str]:
        """The headers that make this request this node's, for node `to` only, once."""
        stamp, nonce = f"{self.clock():.3f}", secrets.token_urlsafe(16)
        headers = {FROM_HEADER: self.tag,
                   SIGNATURE_HEADER: f"t={stamp},n={nonce},to={to},mac="
                   + self._mac(self.tag, to, stamp, nonce, method, raw_path, body, placed)}
        if placed:
            headers[PLACED_HEADER] = placed
        return headers

    def check(self, headers: CIMultiDictProxy[str], method: str, raw_path: str,
              body: bytes) -> Signed:
        """The signature of a request marked as another node's, checked but for its nonce's
        first use (NodeGate): ApiError 403 where it is not right or stale, 421 where it is
        right but for another node."""
        sender = headers.get(FROM_HEADER, "")
        fields = dict(part.partition("=")[::2]
                      for part in headers.get(SIGNATURE_HEADER, "").split(","))
        stamp, nonce, to, mac = (fields.get(name, "") for name in ("t", "n", "to", "mac"))
        if len(sender) != 1 or len(to) != 1 or not mac or not 0 < len(nonce) <= MAX_NONCE_CHARS:
            raise refused("a request marked as another node's carries no valid signature")
        try:
            signed_at = float(stamp)
        except ValueError:
            raise refused("a request marked as another node's carries no valid "
                          "signature") from None
        expected = self._mac(sender, to, stamp, nonce, method, raw_path, body,
                             headers.get(PLACED_HEADER, ""))
        if not hmac.compare_digest(expected, mac):
            raise refused("a request marked as another node's carries no valid signature")
        if not abs(self.clock() - signed_at) <= MAX_AGE_S:
            raise refused(f"this node's request was signed more than {MAX_AGE_S:.0f} s "
                          "from now (a stale copy, or the nodes' clocks differ)")
        if to != self.tag:
            raise ApiError("node_misdirected", f"this request was signed for node {to}; this "
                           f"is node {self.tag}", status=MISDIRECTED)
        return Signed(sender, nonce, signed_at + MAX_AGE_S)


class LocalNonces:
    """The nonces this process saw, each until its signature is stale; LOCAL_NONCES at most
    (past that the oldest goes first: Redis, while up, still knows it)."""

    def __init__(self, limit: int = LOCAL_NONCES) -> None:
        self.limit = limit
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.forgotten = 0  # dropped before they were stale (the table was full)

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, key: str, stale_at: float, now: float) -> bool:
        while self._seen:
            oldest, until = next(iter(self._seen.items()))
            if until > now and len(self._seen) < self.limit:
                break
            del self._seen[oldest]
            self.forgotten += until > now
        if key in self._seen:
            return False
        self._seen[key] = stale_at
        return True


# (key, milliseconds to keep it) -> True the first time, False after, None when the shared
# store cannot say (store.Store.first_use)
SharedFirstUse = Callable[[str, int], Awaitable[bool | None]]


class NodeGate:
    """Where a request from another node comes in: its signature checked, then its nonce
    spent (here and, while Redis answers, in Redis for every node and worker)."""

    def __init__(self, signer: NodeSigner, shared: SharedFirstUse | None = None,
                 local: LocalNonces | None = None) -> None:
        self.signer = signer
        self.shared = shared
        self.local = local if local is not None else LocalNonces()
        self.replays = 0  # refused as replays since start

    async def admit(self, headers: CIMultiDictProxy[str], method: str, raw_path: str,
                    body: bytes) -> str:
        """The node that sent this request; ApiError when it is not to be taken as that
        node's (403 not signed rightly, 421 signed for another node, 409 seen before)."""
        signed = self.signer.check(headers, method, raw_path, body)
        key = f"nonce:{signed.sender}:{signed.nonce}"
        now = self.signer.clock()
        first = self.local.first_use(key, signed.stale_at, now)
        if first and self.shared is not None:
            keep_ms = int((signed.stale_at - now) * 1000) + 1000
            first = await self.shared(key, max(1, keep_ms)) is not False
        if not first:
            self.replays += 1
            raise ApiError("node_request_replayed", "this node-to-node request was already "
                           "received once (a signature is good for one request)",
                           status=409)
        return signed.sender
