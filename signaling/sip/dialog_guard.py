"""In-dialog requests only from where the dialog's own requests may come (RFC 3261 §12, §16).

One rule for every request inside a live dialog, whichever side placed the call: re-INVITE,
UPDATE, BYE, INFO, NOTIFY (a transfer's too), REFER, PRACK, ACK, and the CANCEL of a ringing
inbound call. The request's source is the transport address it came from (the UDP datagram's
source, the TCP/TLS connection's peer), never a header its sender wrote (Via `received`,
Contact): the user agent hands that address here. It must be one of the dialog's:

- an inbound call (`dialog_sources`): the address its INVITE came from (the caller, or the
  first-hop proxy that sent it), the remote target (Contact, moved by a target refresh of the
  dialog's own) and the hosts of the route set (Record-Route) when they are IP literals;
- an outbound call (`outbound_dialog_sources`): the address its INVITE went to (the peer, or
  the trunk's proxy), the 2xx's Contact (moved by a target refresh) and the route set.

Addresses are compared without ports: a UA may send over TCP from any port, and over UDP from
another socket than its Contact's. Anything else is refused by the user agent before the
request reaches the call (403, an ACK dropped) and counted as `spoofed_in_dialog`; the call
goes on untouched. Outbound calls register their dialog's sources in `DialogSources`, the
user agent's registry beside its own inbound calls.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from signaling.sip.dialog import Dialog, DialogId
from signaling.sip.message import SipRequest
from signaling.sip.uri import parse_name_addr

Sources = Callable[[], frozenset[str]]


def _ip_of(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def dialog_sources(invite: SipRequest, invite_source: str, dialog: Dialog) -> frozenset[str]:
    """The addresses an inbound call's in-dialog requests may come from (see the module doc);
    `invite_source` is the transport address its INVITE came from. The same as an outbound
    call's, from the INVITE's source, plus the INVITE's Contact hosts."""
    contacts = (parse_name_addr(value) for value in invite.headers.get_all("contact"))
    hosts = (_ip_of(contact.uri.host) for contact in contacts if contact is not None)
    return outbound_dialog_sources(invite_source, dialog) | {ip for ip in hosts if ip}


def outbound_dialog_sources(next_hop: str, dialog: Dialog) -> frozenset[str]:
    """The addresses the far end of an outbound call may send its in-dialog requests from:
    where the agent sent its INVITE (the peer, or the trunk's proxy), the remote target
    (the 2xx's Contact, moved by a target refresh) and the route set's IP hosts."""
    sources = {ip for ip in (_ip_of(next_hop), _ip_of(dialog.remote_target.host)) if ip}
    sources.update(ip for ip in (_ip_of(route.uri.host) for route in dialog.route_set) if ip)
    return frozenset(sources)


def source_allowed(sources: frozenset[str], address: str) -> bool:
    """Whether the transport address `address` is one of `sources`."""
    ip = _ip_of(address)
    return ip is not None and ip in sources


class DialogSources:
    """The allowed sources of dialogs the user agent's core does not own (outbound calls)."""

    def __init__(self) -> None:
        self._dialogs: dict[DialogId, Sources] = {}

    def add(self, dialog: DialogId, sources: Sources) -> None:
        self._dialogs[dialog] = sources

    def remove(self, dialog: DialogId) -> None:
        self._dialogs.pop(dialog, None)

    def get(self, dialog: DialogId) -> frozenset[str] | None:
        """The dialog's allowed sources now; None for a dialog not registered here."""
        sources = self._dialogs.get(dialog)
        return sources() if sources is not None else None

    def __len__(self) -> int:
        return len(self._dialogs)
