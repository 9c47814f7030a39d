"""Digest authentication for the agent's own requests (RFC 3261 §22 with RFC 2617/RFC 7616):
read a 401/407 challenge, answer it with an Authorization or Proxy-Authorization value.

MD5, MD5-sess, SHA-256 and SHA-256-sess; `qop=auth` where the challenge offers it (RFC 2069
style without qop otherwise). When a response carries several challenges the strongest
algorithm the agent knows wins (SHA-256 before MD5). `auth-int` alone is not served (no SIP
server in use asks for it): `answer` is then None and the call ends `auth_failed`.

Why our own: the maintained Python implementations are parts of HTTP clients and take their
requests and responses as their input (`requests.auth.HTTPDigestAuth`, `httpx.DigestAuth`
keep their hashing in private methods driven by the client's flow), none parses a SIP
challenge, and the arithmetic is a few lines of `hashlib`. The header grammar reuses
uri.py's quoted-string helpers.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from signaling.sip.uri import is_token, read_quoted, split_outside_quotes

HASHES = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}
PREFERENCE = ("SHA-256", "SHA-256-SESS", "MD5", "MD5-SESS")


@dataclass(frozen=True)
class Challenge:
    """One `Digest` challenge (WWW-Authenticate or Proxy-Authenticate)."""

    realm: str
    nonce: str
    algorithm: str = "MD5"  # upper-case, e.g. SHA-256-SESS
    qop: tuple[str, ...] = ()  # offered qop values, lower-case
    opaque: str | None = None
    stale: bool = False

    @property
    def supported(self) -> bool:
        base = self.algorithm.removesuffix("-SESS")
        return base in HASHES and (not self.qop or "auth" in self.qop)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never the password in logs or tracebacks
        return f"Credentials(username={self.username!r}, password='***')"


def parse_params(text: str) -> dict[str, str] | None:
    """`a=b, c="d, e"` into {a: b, c: 'd, e'} (names lower-cased); None when malformed."""
    pieces = split_outside_quotes(text, ",")
    if pieces is None:
        return None
    params: dict[str, str] = {}
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        name, sep, value = piece.partition("=")
        name, value = name.strip().lower(), value.strip()
        if not sep or not is_token(name):
            return None
        if value.startswith('"'):
            quoted = read_quoted(value, 0)
            if quoted is None or quoted[1] != len(value):
                return None
            value = quoted[0]
        elif not value or not is_token(value):
            return None
        params[name] = value
    return params


def parse_challenge(text: str) -> Challenge | None:
    """A `Digest realm=..., nonce=...` value; None when it is not Digest or is malformed."""
    scheme, _, rest = text.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    params = parse_params(rest)
    if params is None or "nonce" not in params:
        return None
    qop = tuple(value.strip().lower() for value in params.get("qop", "").split(",")
                if value.strip())
    return Challenge(realm=params.get("realm", ""), nonce=params["nonce"],
                     algorithm=params.get("algorithm", "MD5").upper(), qop=qop,
                     opaque=params.get("opaque"),
                     stale=params.get("stale", "").lower() == "true")


def best_challenge(values: list[str]) -> Challenge | None:
    """The strongest supported challenge among a response's header values, else None."""
    usable = [c for c in (parse_challenge(value) for value in values)
              if c is not None and c.supported]
    if not usable:
        return None
    return min(usable, key=lambda c: PREFERENCE.index(c.algorithm)
               if c.algorithm in PREFERENCE else len(PREFERENCE))


def _hash(algorithm: str, text: str) -> str:
    return HASHES[algorithm.removesuffix("-SESS")](text.encode("utf-8")).hexdigest()


def response_value(challenge: Challenge, credentials: Credentials, method: str, uri: str,
                   cnonce: str, nc: int = 1) -> str:
    """The `response` parameter (RFC 7616 §3.4.1; RFC 2617 §3.2.2.1 without qop)."""
    algorithm = challenge.algorithm
    ha1 = user_hash(algorithm, credentials.username, challenge.realm, credentials.password)
    return response_from_ha1(algorithm, ha1, challenge.nonce, method, uri,
                             "auth" if challenge.qop else None, nc, cnonce)


def user_hash(algorithm: str, username: str, realm: str, password: str) -> str:
    """H(username:realm:password), the HA1 a server may keep instead of the password."""
    return _hash(algorithm, f"{username}:{realm}:{password}")


def response_from_ha1(algorithm: str, ha1: str, nonce: str, method: str, uri: str,
                      qop: str | None, nc: int, cnonce: str) -> str:
    """The `response` from HA1 (RFC 7616 §3.4.1; RFC 2617 §3.2.2.1 without qop): what a
    client sends, and what a server checking one computes (caller_auth.py)."""
    if algorithm.endswith("-SESS"):
        ha1 = _hash(algorithm, f"{ha1}:{nonce}:{cnonce}")
    ha2 = _hash(algorithm, f"{method}:{uri}")
    if qop:
        return _hash(algorithm, f"{ha1}:{nonce}:{nc:08x}:{cnonce}:{qop}:{ha2}")
    return _hash(algorithm, f"{ha1}:{nonce}:{ha2}")


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def answer(challenge: Challenge, credentials: Credentials, method: str, uri: str, *,
           cnonce: str | None = None, nc: int = 1) -> str | None:
    """The Authorization / Proxy-Authorization value answering `challenge` for a request of
    `method` to `uri`; None when the challenge asks for something not served."""
    if not challenge.supported:
        return None
    cnonce = cnonce or secrets.token_hex(8)
    parts = [
        f"username={_quoted(credentials.username)}",
        f"realm={_quoted(challenge.realm)}",
        f"nonce={_quoted(challenge.nonce)}",
        f"uri={_quoted(uri)}",
        f"response={_quoted(response_value(challenge, credentials, method, uri, cnonce, nc))}",
        f"algorithm={challenge.algorithm}",
    ]
    if challenge.qop:
        parts += ["qop=auth", f"nc={nc:08x}", f"cnonce={_quoted(cnonce)}"]
    if challenge.opaque is not None:
        parts.append(f"opaque={_quoted(challenge.opaque)}")
    return "Digest " + ", ".join(parts)
