"""Requests between nodes, signed with the cluster secret (`--cluster-secret`).

The same HMAC-SHA256 as the workers' private channel (signaling/workers/channel.py
`mac_of`, `fresh`), over the fields a node-to-node request must not have changed: the
forwarding node's tag, a timestamp, the method, the raw path and query, the SHA-256 of the
body, and the slot the forwarding node placed the call in (if any). A request counts as a
node's only with a right and fresh MAC; a client, which never sees the secret, cannot make
one, and the headers of a client that sends them are dropped before anything is relayed.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field

from multidict import CIMultiDictProxy

from signaling.workers.channel import fresh, mac_of

FROM_HEADER = "X-Agent-Node-Forwarded"
SIGNATURE_HEADER = "X-Agent-Node-Signature"
PLACED_HEADER = "X-Agent-Node-Placed"  # the slot the forwarding node took for a new call
NODE_HEADERS = frozenset(h.lower() for h in (FROM_HEADER, SIGNATURE_HEADER, PLACED_HEADER))


@dataclass(frozen=True)
class NodeSigner:
    tag: str  # this node's
    secret: bytes = field(repr=False)

    def _mac(self, sender: str, stamp: str, method: str, raw_path: str, body: bytes,
             placed: str) -> str:
        return mac_of(self.secret, "node", sender, stamp, method, raw_path,
                      hashlib.sha256(body).hexdigest(), placed)

    def sign(self, method: str, raw_path: str, body: bytes, placed: str = "") -> dict[str, str]:
        stamp = f"{time.time():.3f}"
        headers = {FROM_HEADER: self.tag,
                   SIGNATURE_HEADER: f"t={stamp},mac="
                   + self._mac(self.tag, stamp, method, raw_path, body, placed)}
        if placed:
            headers[PLACED_HEADER] = placed
        return headers

    def verify(self, headers: CIMultiDictProxy[str], method: str, raw_path: str,
               body: bytes) -> str | None:
        """The node that signed this request, or None (not signed, or not rightly)."""
        sender = headers.get(FROM_HEADER, "")
        fields = dict(part.partition("=")[::2]
                      for part in headers.get(SIGNATURE_HEADER, "").split(","))
        stamp, mac = fields.get("t", ""), fields.get("mac", "")
        if len(sender) != 1 or not mac or not fresh(stamp):
            return None
        expected = self._mac(sender, stamp, method, raw_path, body,
                             headers.get(PLACED_HEADER, ""))
        return sender if hmac.compare_digest(expected, mac) else None
