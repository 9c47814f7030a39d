"""Which URL each transport of the headless peer dials, checked before dialling.

`transport_of(url)` names the transport a URL's scheme implies (`sip:`/`sips:` a SIP URI,
`ws(s)://` a media-stream websocket, `rtp://` a bare RTP address; http(s) says nothing: every
transport but sip takes one). `url_problem(url, transport)` is the one line saying why a
transport cannot dial a URL (None when it can): the command line refuses such a URL before
dialling, and each transport's `connect` checks with the same function.
Kept free of the transports' imports: the command line uses it before loading any of them.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

# sip:USER@HOST[:PORT][;params]; the user part is optional (the peer dials `agent` then).
SIP_URI = re.compile(r"^sips?:(?:(?P<user>[^@;]+)@)?(?P<host>\[[^\]]+\]|[^:;>]+)"
                     r"(?::(?P<port>\d+))?(?P<params>;.*)?$")

IMPLIED = {"sip": "sip", "sips": "sip", "ws": "media-stream", "wss": "media-stream",
           "rtp": "rtp"}
HTTP_TRANSPORTS = ("webrtc", "realtime")


def scheme_of(url: str) -> str:
    """The URL's scheme, lower-case (`sip` for `sip:agent@host`, which urlparse also reads)."""
    return urlparse(url.strip()).scheme.lower()


def transport_of(url: str) -> str | None:
    """The transport the URL's scheme implies; None for http(s) and anything else."""
    return IMPLIED.get(scheme_of(url))


def _other_transport_hint(url: str, transport: str) -> str:
    implied = transport_of(url)
    if implied is None or implied == transport:
        return ""
    return f" (a {scheme_of(url)}: URL is for --transport {implied}, or leave --transport out)"


def url_problem(url: str, transport: str) -> str | None:
    """Why `transport` cannot dial `url`, in one line; None when it can."""
    parsed = urlparse(url.strip())
    scheme = parsed.scheme.lower()
    if transport in HTTP_TRANSPORTS:
        if scheme in ("http", "https") and parsed.netloc:
            return None
        return (f"{url}: the {transport} transport needs an http:// or https:// URL"
                + _other_transport_hint(url, transport))
    if transport == "media-stream":
        if scheme in ("http", "https", "ws", "wss") and parsed.netloc:
            return None
        return (f"{url}: the media-stream transport needs an http(s):// or ws(s):// URL"
                + _other_transport_hint(url, transport))
    if transport == "rtp":
        if scheme not in ("http", "https", "rtp") or not parsed.hostname:
            return (f"{url}: the rtp transport needs http(s)://HOST:PORT (the agent's RTP "
                    "control) or rtp://HOST:PORT" + _other_transport_hint(url, transport))
        if scheme == "rtp" and parsed.port is None:
            return f"{url}: rtp:// needs a port"
        return None
    if transport == "sip":
        if scheme == "sips":
            return (f"{url}: sips: is SIP over TLS; the peer's SIP speaks UDP only "
                    "(dial sip:USER@HOST[:PORT])")
        if scheme != "sip" or SIP_URI.match(url.strip()) is None:
            return f"{url}: the sip transport dials sip:USER@HOST[:PORT]"
        return None
    return None
