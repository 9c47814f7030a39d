"""SIP dialogs (RFC 3261 §12): the state two user agents share for one call, and the
in-dialog requests built from it.

A dialog is identified by Call-ID and both tags. The agent is always the UAS of its dialogs
for now (inbound calls), so it builds its dialog from the INVITE: the route set is the
INVITE's Record-Route in order, the remote target its Contact. Requests the agent sends in
the dialog (BYE) go to the remote target through the route set: with a loose router first
(`;lr`) the Request-URI is the remote target and the Route headers the whole set; with a
strict router the Request-URI is that router and the remote target the last Route (§12.2.1.1).
The next hop is the first Route, else the Request-URI. A later target refresh (re-INVITE)
updates the remote target.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from signaling.sip.message import Headers, SipRequest
from signaling.sip.uri import NameAddr, Uri, parse_name_addr

DialogId = tuple[str, str, str]  # (Call-ID, local tag, remote tag)


def new_tag() -> str:
    return secrets.token_hex(6)


def new_branch() -> str:
    return "z9hG4bK" + secrets.token_hex(8)


@dataclass
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_party: str  # our From/To value, with our tag (as written in responses)
    remote_party: str  # theirs, with their tag
    remote_target: Uri
    route_set: list[NameAddr] = field(default_factory=list)
    local_seq: int = field(default_factory=lambda: secrets.randbelow(2**20) + 1)
    remote_seq: int = 0
    transport: str = "UDP"  # of the request that created the dialog

    @property
    def id(self) -> DialogId:
        return self.call_id, self.local_tag, self.remote_tag

    @classmethod
    def from_invite(cls, invite: SipRequest, local_tag: str, transport: str) -> Dialog | None:
        """The UAS side's dialog (§12.1.1); None without a usable Contact."""
        contacts = invite.headers.get_all("contact")
        contact = parse_name_addr(contacts[0]) if contacts else None
        if contact is None:
            return None
        routes = [parse_name_addr(value) for value in invite.headers.get_all("record-route")]
        if any(route is None for route in routes):
            return None
        to_text = invite.headers.get("to") or ""
        return cls(
            call_id=invite.call_id,
            local_tag=local_tag,
            remote_tag=invite.from_addr.tag or "",
            local_party=f"{to_text};tag={local_tag}",
            remote_party=invite.headers.get("from") or "",
            remote_target=contact.uri,
            route_set=[route for route in routes if route is not None],
            remote_seq=invite.cseq.number,
            transport=transport,
        )

    def refresh_target(self, request: SipRequest) -> None:
        """A target refresh request (re-INVITE) moves the remote target to its Contact."""
        contacts = request.headers.get_all("contact")
        contact = parse_name_addr(contacts[0]) if contacts else None
        if contact is not None:
            self.remote_target = contact.uri

    def request(self, method: str, via_host: str, via_port: int, transport: str,
                contact: str | None = None) -> tuple[SipRequest, Uri]:
        """A new in-dialog request and the URI of its next hop (§12.2.1.1)."""
        self.local_seq += 1
        routes = list(self.route_set)
        strict = bool(routes) and not routes[0].uri.has_param("lr")
        if strict:
            request_uri = routes[0].uri.without_params("method", "maddr", "ttl", "lr")
            routes = routes[1:] + [NameAddr(uri=self.remote_target)]
        else:
            request_uri = self.remote_target
        headers = Headers()
        host = f"[{via_host}]" if ":" in via_host else via_host
        headers.add("Via", f"SIP/2.0/{transport} {host}:{via_port};branch={new_branch()};rport")
        for route in routes:
            headers.add("Route", str(route))
        headers.add("Max-Forwards", "70")
        headers.add("From", self.local_party)
        headers.add("To", self.remote_party)
        headers.add("Call-ID", self.call_id)
        headers.add("CSeq", f"{self.local_seq} {method}")
        if contact is not None:
            headers.add("Contact", contact)
        request = SipRequest(headers=headers, method=method, uri=str(request_uri))
        # §8.1.2: the first Route, unless a strict router is the Request-URI itself.
        next_hop = routes[0].uri if routes and not strict else request_uri
        return request, next_hop
