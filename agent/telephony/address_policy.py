"""Which peer addresses an RTP leg may send to or latch onto (anti-reflection).

An RTP leg sends 50 packets/s to its remote for as long as it lives, without the remote ever
having asked. Unchecked, anyone who may open a leg could aim that stream anywhere: at a third
party, at a whole subnet (broadcast, multicast) or at a cloud metadata service (link-local).
So a remote — given in the request or latched from the first sender — must be inside an
allow list of networks (`--rtp-allow`, default loopback and the private ranges, where PBXes
live), and a few kinds of address are refused whatever the list says, because no PBX is
ever there.

The policy is a pure function of the address and the allow list; callers turn a refusal into
an HTTP 4xx (signaling) or a dropped packet (a latching leg).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_RTP_ALLOW: tuple[str, ...] = (
    "127.0.0.0/8", "::1/128",  # loopback: a PBX or bridge on the same host
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918
    "fc00::/7",  # IPv6 unique local
)
LIMITED_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


@dataclass(frozen=True)
class Refusal:
    """Why an address is refused, in the shape of an HTTP error."""

    status: int  # 400: never a valid RTP peer; 403: valid, but outside the allow list
    code: str
    message: str


def parse_networks(texts: Iterable[str]) -> tuple[IPNetwork, ...]:
    """CIDR strings → networks; ValueError names the bad one. Host bits are tolerated
    (`10.1.2.3/8` means 10/8) since operators paste interface addresses."""
    networks = []
    for text in texts:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR network, e.g. 10.0.0.0/8") from None
    return tuple(networks)


DEFAULT_ALLOWED_NETWORKS: tuple[IPNetwork, ...] = parse_networks(DEFAULT_RTP_ALLOW)


def _unmapped(address: IPAddress) -> IPAddress:
    # ::ffff:169.254.169.254 reaches the IPv4 address on a dual-stack socket: judge that one.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def never_allowed_kind(address: IPAddress) -> str | None:
    """The kind of address no RTP peer can be, or None."""
    address = _unmapped(address)
    if address.is_unspecified:
        return "unspecified"
    if address.is_multicast:
        return "multicast"
    if address == LIMITED_BROADCAST:
        return "broadcast"
    if address.is_link_local:
        return "link-local"  # includes 169.254.169.254, the cloud metadata service
    return None


def refusal_for(host: str, allowed: Iterable[IPNetwork]) -> Refusal | None:
    """None when `host` (an IP literal) may be an RTP leg's remote, else why not."""
    try:
        address = _unmapped(ipaddress.ip_address(host.split("%", 1)[0]))
    except ValueError:
        return Refusal(400, "invalid_address", f"{host!r} is not an IP address")
    kind = never_allowed_kind(address)
    if kind is not None:
        return Refusal(400, "address_not_permitted",
                       f"RTP is never sent to a {kind} address ({address})")
    if not any(address.version == net.version and address in net for net in allowed):
        return Refusal(403, "address_not_allowed",
                       f"{address} is outside the networks RTP legs may reach (--rtp-allow)")
    return None
