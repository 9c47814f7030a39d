"""SIP URIs, name-addr values and header parameters (RFC 3261 sections 19.1, 20, 25).

The agent's own SIP stack needs these pieces of the grammar and no more: the scheme, user,
host, port and parameters of a URI (where to send in-dialog requests, `lr`, `transport`),
the display name, URI and parameters of a From/To/Contact/Route value (tags, route sets),
and generic `;name=value` parameter lists. Everything is parsed into plain values or None
for "not valid": nothing here raises on client input.

Why our own: no SIP library on PyPI is fit (docs/sip.md; they own the RTP themselves, or
mishandle retransmissions and routing), and the grammar needed for a user agent is small.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace

Params = tuple[tuple[str, str | None], ...]

SIP_SCHEMES = frozenset({"sip", "sips"})
DEFAULT_PORTS = {"sip": 5060, "sips": 5061}

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+\-.]*\Z")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*\.?\Z")
_TOKEN = re.compile(r"[A-Za-z0-9\-.!%*_+`'~]+\Z")
# Characters a URI may never hold unescaped (whitespace, controls, angle brackets, quotes).
_URI_FORBIDDEN = re.compile(r"[\x00-\x20\x7f<>\"]")


def is_token(text: str) -> bool:
    return bool(_TOKEN.match(text))


@dataclass(frozen=True)
class Uri:
    """A URI. For sip:/sips: the parts are filled in; other schemes keep only `opaque`."""

    scheme: str  # lower-case
    host: str = ""  # lower-case; an IPv6 literal without its brackets
    user: str | None = None  # as written: still %-escaped
    password: str | None = None
    port: int | None = None
    params: Params = ()
    headers: str | None = None  # the raw `?h=v&...` part, without the `?`
    opaque: str = ""  # everything after `scheme:` for schemes other than sip/sips

    @property
    def is_sip(self) -> bool:
        return self.scheme in SIP_SCHEMES

    def param(self, name: str) -> str | None:
        """A parameter's value ("" for a flag such as `lr`), None when absent."""
        return param_value(self.params, name)

    def has_param(self, name: str) -> bool:
        return has_param(self.params, name)

    @property
    def transport(self) -> str:
        """UDP, TCP or TLS: what the URI's `transport` parameter (or sips:) asks for."""
        value = (self.param("transport") or "").upper()
        if self.scheme == "sips":
            return "TLS"
        return value if value in ("UDP", "TCP", "TLS") else "UDP"

    @property
    def effective_port(self) -> int:
        return self.port or DEFAULT_PORTS.get(self.scheme, 5060)

    def without_params(self, *names: str) -> Uri:
        drop = {name.lower() for name in names}
        return replace(self, params=tuple(p for p in self.params if p[0].lower() not in drop))

    def __str__(self) -> str:
        if not self.is_sip:
            return f"{self.scheme}:{self.opaque}"
        text = f"{self.scheme}:"
        if self.user is not None:
            text += self.user
            if self.password is not None:
                text += ":" + self.password
            text += "@"
        text += format_host(self.host)
        if self.port is not None:
            text += f":{self.port}"
        text += format_params(self.params)
        if self.headers is not None:
            text += "?" + self.headers
        return text


@dataclass(frozen=True)
class NameAddr:
    """A From/To/Contact/Route/Record-Route value: display name, URI, header parameters."""

    uri: Uri
    display_name: str | None = None  # unquoted, unescaped
    params: Params = ()
    bracketed: bool = True  # written as <uri> (needed when the URI has ; , or ?)
    raw_uri: str = field(default="", compare=False)  # the URI as it was written

    @property
    def tag(self) -> str | None:
        return param_value(self.params, "tag")

    def param(self, name: str) -> str | None:
        return param_value(self.params, name)

    def __str__(self) -> str:
        uri = self.raw_uri or str(self.uri)
        text = ""
        if self.display_name is not None:
            text = quote_string(self.display_name) + " "
        return f"{text}<{uri}>{format_params(self.params)}"


def format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def format_params(params: Params) -> str:
    return "".join(f";{name}" if value is None else f";{name}={value}" for name, value in params)


def param_value(params: Params, name: str) -> str | None:
    lowered = name.lower()
    for key, value in params:
        if key.lower() == lowered:
            return "" if value is None else value
    return None


def has_param(params: Params, name: str) -> bool:
    return param_value(params, name) is not None


def quote_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _valid_host(host: str) -> str | None:
    """The host, lower-cased and unbracketed, or None when it is no hostname or IP literal."""
    if host.startswith("["):
        if not host.endswith("]"):
            return None
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            return None
    if _HOSTNAME.match(host):
        return host.lower()
    return None


def _split_params(text: str) -> Params | None:
    """`;a=b;c` (leading `;` already removed) into pairs; None when a name is no token."""
    params: list[tuple[str, str | None]] = []
    if text == "":
        return ()
    for piece in text.split(";"):
        name, sep, value = piece.partition("=")
        if not name:
            return None
        params.append((name, value if sep else None))
    return tuple(params)


def parse_uri(text: str) -> Uri | None:
    """A URI as written in a request line or inside <>; None when it is not valid."""
    if not text or _URI_FORBIDDEN.search(text):
        return None
    scheme, sep, rest = text.partition(":")
    if not sep or not _SCHEME.match(scheme):
        return None
    scheme = scheme.lower()
    if scheme not in SIP_SCHEMES:
        return Uri(scheme=scheme, opaque=rest) if rest else None
    user: str | None = None
    password: str | None = None
    if "@" in rest:
        userinfo, _, rest = rest.partition("@")
        if not userinfo:
            return None
        user, colon, pw = userinfo.partition(":")
        password = pw if colon else None
    headers: str | None = None
    hostport, qmark, after = rest.partition("?")
    if qmark:
        headers = after
    hostport, semi, param_text = hostport.partition(";")
    params = _split_params(param_text) if semi else ()
    if params is None:
        return None
    host_text, port = _split_host_port(hostport)
    host = _valid_host(host_text) if host_text else None
    if host is None or port == -1:
        return None
    return Uri(scheme=scheme, host=host, user=user, password=password, port=port,
               params=params, headers=headers)


def _split_host_port(text: str) -> tuple[str, int | None]:
    """(host, port); port None when absent, -1 when invalid."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return text, -1
        host, rest = text[: end + 1], text[end + 1:]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            return host, -1
        return host, _port(rest[1:])
    host, colon, port_text = text.partition(":")
    return host, (_port(port_text) if colon else None)


def _port(text: str) -> int:
    if not text.isdigit() or len(text) > 5:
        return -1
    port = int(text)
    return port if 0 < port <= 65535 else -1


def unescape(text: str) -> str:
    """%XX escapes decoded (as UTF-8, invalid bytes replaced); a stray % is kept."""
    raw = bytearray()
    index = 0
    while index < len(text):
        char = text[index]
        if char == "%" and _is_hex(text[index + 1: index + 3]):
            raw.append(int(text[index + 1: index + 3], 16))
            index += 3
            continue
        raw.extend(char.encode("utf-8"))
        index += 1
    return raw.decode("utf-8", "replace")


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair)


# -- quoted strings and parameter lists ------------------------------------------------------


def read_quoted(text: str, start: int) -> tuple[str, int] | None:
    """The quoted string opening at text[start] (a `"`): (unescaped content, index after the
    closing quote), or None when it never closes."""
    out: list[str] = []
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            if index + 1 >= len(text):
                return None
            out.append(text[index + 1])
            index += 2
            continue
        if char == '"':
            return "".join(out), index + 1
        out.append(char)
        index += 1
    return None


def split_outside_quotes(text: str, separator: str) -> list[str] | None:
    """Split on `separator` where it is outside quoted strings and <>; None when a quote or
    bracket is left open."""
    if '"' not in text and "<" not in text:
        return text.split(separator)  # the common case (Via, params): nothing to skip over
    parts: list[str] = []
    current: list[str] = []
    index = 0
    in_angle = False
    while index < len(text):
        char = text[index]
        if char == '"' and not in_angle:
            quoted = read_quoted(text, index)
            if quoted is None:
                return None
            current.append(text[index: quoted[1]])
            index = quoted[1]
            continue
        if char == "<":
            in_angle = True
        elif char == ">":
            in_angle = False
        if char == separator and not in_angle:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
        index += 1
    if in_angle:
        return None
    parts.append("".join(current))
    return parts


def parse_header_params(text: str) -> Params | None:
    """`;name = value ;flag ;q="quoted"` (whitespace allowed around `;` and `=`) into pairs.
    `text` starts at the first `;` (or is empty); None when malformed."""
    text = text.strip()
    if not text:
        return ()
    if not text.startswith(";"):
        return None
    pieces = split_outside_quotes(text[1:], ";")
    if pieces is None:
        return None
    params: list[tuple[str, str | None]] = []
    for piece in pieces:
        name, sep, value = piece.partition("=")
        name = name.strip()
        if not is_token(name):
            return None
        if not sep:
            params.append((name, None))
            continue
        value = value.strip()
        if value.startswith('"'):
            quoted = read_quoted(value, 0)
            if quoted is None or quoted[1] != len(value):
                return None
        elif not value or any(c.isspace() for c in value):
            return None
        params.append((name, value))
    return tuple(params)


def parse_name_addr(text: str) -> NameAddr | None:
    """A From/To/Contact/Route value: `"Name" <uri>;p=v`, `Name <uri>`, `<uri>` or a bare
    `uri;p=v` (whose parameters are then the header's, not the URI's). None when invalid."""
    text = text.strip()
    display: str | None = None
    index = 0
    if text.startswith('"'):
        quoted = read_quoted(text, 0)
        if quoted is None:
            return None
        display, index = quoted
        while index < len(text) and text[index] in " \t":
            index += 1
        if index >= len(text) or text[index] != "<":
            return None
    angle = text.find("<", index)
    if angle >= 0 and '"' not in text[index:angle]:
        words = text[index:angle].strip()
        if words and display is None:
            if not all(is_token(word) for word in words.split()):
                return None
            display = " ".join(words.split())
        elif words:
            return None
        close = text.find(">", angle)
        if close < 0:
            return None
        raw_uri = text[angle + 1: close]
        uri = parse_uri(raw_uri)  # whitespace inside <> makes it invalid (RFC 4475 badaspec)
        params = parse_header_params(text[close + 1:])
        if uri is None or params is None:
            return None
        return NameAddr(uri=uri, display_name=display, params=params, raw_uri=raw_uri)
    if display is not None:
        return None
    raw_uri, semi, rest = text.partition(";")
    raw_uri = raw_uri.strip()
    uri = parse_uri(raw_uri)
    params = parse_header_params(semi + rest)
    if uri is None or params is None or "," in raw_uri or "?" in raw_uri:
        return None
    return NameAddr(uri=uri, params=params, bracketed=False, raw_uri=raw_uri)
