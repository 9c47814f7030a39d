"""`--rtc-advertise ADDR`: host candidates that carry a public address (1:1 NAT).

Like Janus's `nat_1_1_mapping` or LiveKit's `node_ip`: the sockets stay bound to the private
address, and only what the caller is told changes. aioice keeps its own candidates (its
checks and pairs use the bound addresses); the answer text the agent returns has each host
candidate's address, and the `c=` lines that name one, replaced by the advertised address of
the same family. The agent trickles none of its own candidates (aiortc gathers them all
before the answer), so the answer is the one place.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence


def parse_advertised(addresses: Sequence[str]) -> tuple[str, ...]:
    """The `--rtc-advertise` values, checked: IP addresses, at most one per family.

    ValueError says what is wrong."""
    seen: dict[int, str] = {}
    for text in addresses:
        try:
            address = ipaddress.ip_address(text.strip())
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv4 or IPv6 address") from None
        if address.is_unspecified or address.is_multicast:
            raise ValueError(f"{text!r} cannot be a candidate's address")
        if address.version in seen:
            raise ValueError(f"one address per family: {seen[address.version]} and {address} "
                             f"are both IPv{address.version}")
        seen[address.version] = str(address)
    return tuple(seen.values())


def _family(address: str) -> int | None:
    try:
        return ipaddress.ip_address(address).version
    except ValueError:
        return None  # an mDNS name or anything else: left as it is


def advertise_in_sdp(sdp: str, advertised: Sequence[str]) -> str:
    """`sdp` with every host candidate's address replaced by the advertised address of its
    family, and every `c=` line naming a replaced address likewise (ports unchanged)."""
    if not advertised:
        return sdp
    by_family = {_family(address): address for address in advertised}
    replaced: dict[str, str] = {}
    newline = "\r\n" if "\r\n" in sdp else "\n"
    lines = sdp.split(newline)
    for i, line in enumerate(lines):
        if not line.startswith("a=candidate:"):
            continue
        fields = line.split(" ")
        # foundation component transport priority address port "typ" type ...
        if len(fields) < 8 or fields[6] != "typ" or fields[7] != "host":
            continue
        public = by_family.get(_family(fields[4]))
        if public is None:
            continue
        replaced[fields[4]] = public
        fields[4] = public
        lines[i] = " ".join(fields)
    for i, line in enumerate(lines):
        if line.startswith("c=IN IP"):
            fields = line.split(" ")
            if len(fields) == 3 and fields[2] in replaced:
                public = replaced[fields[2]]
                lines[i] = f"c=IN IP{_family(public)} {public}"
    return newline.join(lines)
