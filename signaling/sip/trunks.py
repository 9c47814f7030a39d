"""SIP trunks for outbound calls (`--sip-trunks FILE`): named outbound proxies, registrar-less,
with the digest credentials that answer their challenges.

The file is one JSON object of named trunks, e.g.

    {"t1": {"proxy": "sip:192.0.2.10:5060", "username": "agent", "password": "…",
            "transport": "udp", "from_user": "agent", "from_domain": "sip.example.com",
            "realm": "sip.example.com"}}

`proxy` (a sip: URI with an IP literal or a host name) is where every INVITE of the trunk is
sent, whatever its Request-URI; `username`/`password` answer a 401/407 once (both or neither);
`transport` (udp or tcp; default the proxy URI's, else udp); `from_user` and `from_domain`
make the default From (`sip:from_user@from_domain`; defaults: the username, else `agent`,
and the proxy's host); `realm`, when set, is the only realm the credentials are given to.
Credentials live in the file only (never on the command line) and never reach a log line:
`Trunk.__repr__` hides the password.

What a trunk may be used for (docs/sip.md, "Outbound limits"):
- `allow`: the destinations its calls may reach, patterns of numbers or URIs
  (outbound_policy.Destinations; absent: any);
- `keys`: the API keys (as given to `--api-key`) that may place calls through it (absent: every
  key; an `--admin-key` always may); kept as their tenant names, never as the keys;
- `inbound_key`: the API key that owns the calls arriving from the trunk's proxy address with
  `--sip-webhook` (overrides `--sip-inbound-key` for them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import AgentError
from signaling.auth import tenant_of
from signaling.sip.digest import Credentials
from signaling.sip.outbound_policy import Destinations
from signaling.sip.uri import Uri, is_token, parse_uri

MAX_TRUNKS_FILE_BYTES = 1024 * 1024
FIELDS = frozenset({"proxy", "username", "password", "transport", "from_user", "from_domain",
                    "realm", "allow", "keys", "inbound_key"})
MAX_KEYS = 1000
TRANSPORTS = ("UDP", "TCP")


class TrunkFileError(AgentError, ValueError):
    """The trunks file is unusable; the message says where and why (never a password). At
    start-up it is one of the SIP settings' mistakes (`sip_config_invalid`)."""

    def __init__(self, message: str) -> None:
        super().__init__("sip_config_invalid", message)


@dataclass(frozen=True)
class Trunk:
    name: str
    proxy: Uri
    transport: str = "UDP"
    credentials: Credentials | None = field(default=None, repr=False)
    from_user: str = "agent"
    from_domain: str = ""
    realm: str | None = None
    allow: Destinations = field(default_factory=Destinations)
    tenants: frozenset[str] | None = field(default=None, repr=False)  # None: every key
    inbound_tenant: str | None = field(default=None, repr=False)

    def usable_by(self, tenant: str | None, operator: bool) -> bool:
        """May a key of `tenant` (an operator: any) place calls through this trunk?"""
        return operator or self.tenants is None or (
            tenant is not None and tenant in self.tenants)

    def credentials_for(self, realm: str) -> Credentials | None:
        """The credentials for a challenge of `realm` (None: not ours to answer)."""
        if self.realm is not None and realm != self.realm:
            return None
        return self.credentials

    def describe(self) -> dict[str, Any]:
        """What /metrics/sip may show: no username or password."""
        return {"proxy": str(self.proxy), "transport": self.transport,
                "authenticated": self.credentials is not None,
                "allow": list(self.allow.patterns) or None,
                "keys": len(self.tenants) if self.tenants is not None else None}


def _text(entry: Mapping[str, Any], key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(c in value for c in "\r\n\x00"):
        raise TrunkFileError(f"{where}: '{key}' must be a non-empty string on one line")
    return value


def parse_trunk(name: str, entry: object, where: str) -> Trunk:
    where = f"{where}: trunk {name!r}"
    if not name or not is_token(name):
        raise TrunkFileError(f"{where}: a trunk name must be a token (letters, digits, -._)")
    if not isinstance(entry, dict):
        raise TrunkFileError(f"{where}: must be a JSON object")
    unknown = sorted(set(entry) - FIELDS)
    if unknown:
        raise TrunkFileError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(sorted(FIELDS))}")
    proxy_text = _text(entry, "proxy", where)
    proxy = parse_uri(proxy_text) if proxy_text else None
    if proxy is None or proxy.scheme != "sip" or not proxy.host:
        raise TrunkFileError(f"{where}: 'proxy' must be a sip: URI such as "
                             "sip:192.0.2.10:5060")
    username = _text(entry, "username", where)
    password = _text(entry, "password", where)
    if (username is None) != (password is None):
        raise TrunkFileError(f"{where}: give both 'username' and 'password', or neither")
    transport = (_text(entry, "transport", where) or proxy.param("transport") or "udp").upper()
    if transport not in TRANSPORTS:
        raise TrunkFileError(f"{where}: 'transport' must be udp or tcp")
    from_user = _text(entry, "from_user", where) or username or "agent"
    from_domain = _text(entry, "from_domain", where) or proxy.host
    for key, value in (("from_user", from_user), ("from_domain", from_domain)):
        if parse_uri(f"sip:{value}@example.com" if key == "from_user" else f"sip:{value}") \
                is None:
            raise TrunkFileError(f"{where}: {key!r} is not usable in a sip: URI")
    credentials = (Credentials(username, password)
                   if username is not None and password is not None else None)
    try:
        allow = Destinations.parse(entry.get("allow"), where)
    except ValueError as exc:
        raise TrunkFileError(str(exc)) from None
    keys = entry.get("keys")
    if keys is not None and (not isinstance(keys, list) or len(keys) > MAX_KEYS or not all(
            isinstance(k, str) and k and not any(c in k for c in "\r\n\x00") for k in keys)):
        raise TrunkFileError(f"{where}: 'keys' must be a list of API keys (as given to "
                             "--api-key) that may call through this trunk")
    inbound = _text(entry, "inbound_key", where)
    return Trunk(name=name, proxy=proxy, transport=transport, credentials=credentials,
                 from_user=from_user, from_domain=from_domain,
                 realm=_text(entry, "realm", where), allow=allow,
                 tenants=frozenset(map(tenant_of, keys)) if keys is not None else None,
                 inbound_tenant=tenant_of(inbound) if inbound is not None else None)


def parse_trunks(data: object, where: str = "trunks") -> dict[str, Trunk]:
    if not isinstance(data, dict):
        raise TrunkFileError(f"{where}: must be a JSON object of named trunks, e.g. "
                             '{"t1": {"proxy": "sip:HOST:PORT", "username": "…", '
                             '"password": "…"}}')
    return {name: parse_trunk(name, entry, where) for name, entry in data.items()}


def load_trunks(path: str | Path) -> dict[str, Trunk]:
    """Read and check the trunks file; TrunkFileError with a clear message otherwise."""
    where = f"--sip-trunks {path}"
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TRUNKS_FILE_BYTES + 1)
    except OSError as exc:
        raise TrunkFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_TRUNKS_FILE_BYTES:
        raise TrunkFileError(f"{where}: over {MAX_TRUNKS_FILE_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise TrunkFileError(f"{where}: not UTF-8") from None
    except json.JSONDecodeError as exc:
        # The position only, not the text around it: the file holds passwords.
        raise TrunkFileError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                             f"column {exc.colno})") from None
    return parse_trunks(data, where)
