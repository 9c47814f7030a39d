"""The RTP anti-reflection policy as a pure function: which remotes a leg may reach."""

from __future__ import annotations

import ipaddress

import pytest

from agent.telephony.address_policy import (
    DEFAULT_ALLOWED_NETWORKS,
    never_allowed_kind,
    parse_networks,
    refusal_for,
)


@pytest.mark.parametrize("host", [
    "127.0.0.1", "127.8.9.10", "::1", "10.1.2.3", "172.16.0.1", "172.31.255.254",
    "192.168.1.20", "fd00::5", "fc12::1", "::ffff:10.0.0.7",
])
def test_defaults_allow_loopback_and_private_ranges(host: str) -> None:
    assert refusal_for(host, DEFAULT_ALLOWED_NETWORKS) is None


@pytest.mark.parametrize("host", [
    "8.8.8.8", "172.32.0.1", "192.0.2.10", "100.64.0.1", "2001:db8::1", "::ffff:8.8.8.8",
])
def test_public_addresses_are_outside_the_defaults(host: str) -> None:
    refusal = refusal_for(host, DEFAULT_ALLOWED_NETWORKS)
    assert refusal is not None and (refusal.status, refusal.code) == (403, "address_not_allowed")


@pytest.mark.parametrize("host, kind", [
    ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("::ffff:169.254.169.254", "link-local"), ("::ffff:224.0.0.1", "multicast"),
])
def test_some_kinds_are_refused_even_when_listed(host: str, kind: str) -> None:
    everything = parse_networks(["0.0.0.0/0", "::/0"])
    assert never_allowed_kind(ipaddress.ip_address(host)) == kind
    refusal = refusal_for(host, everything)
    assert refusal is not None and (refusal.status, refusal.code) == (400, "address_not_permitted")
    assert kind in refusal.message


def test_an_explicit_list_replaces_the_defaults() -> None:
    only_pbx = parse_networks(["203.0.113.0/24"])
    assert refusal_for("203.0.113.9", only_pbx) is None
    assert refusal_for("127.0.0.1", only_pbx) is not None
    assert refusal_for("10.0.0.1", only_pbx) is not None


def test_malformed_hosts_and_networks() -> None:
    refusal = refusal_for("example.com", DEFAULT_ALLOWED_NETWORKS)
    assert refusal is not None and (refusal.status, refusal.code) == (400, "invalid_address")
    assert parse_networks(["10.1.2.3/8"]) == (ipaddress.ip_network("10.0.0.0/8"),)
    with pytest.raises(ValueError, match="not a CIDR"):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="not a CIDR"):
        parse_networks(["pbx.local"])
