"""Digest authentication of callers (RFC 3261 §22.2, RFC 7616): `--sip-auth-file FILE`.

With an auth file, every out-of-dialog request but OPTIONS (load balancers' probes; they
learn nothing but whether the node serves), CANCEL (RFC 3261 §22.1: never challenged) and
ACK is challenged: 401 with two `WWW-Authenticate` values, MD5 and SHA-256 (in that order,
see ALGORITHMS), each with `qop="auth"`. The request sent again with an `Authorization`
that answers one is served; a wrong answer (unknown user, wrong password, another realm or
URI) gets 403. The nonce is the issue time and an HMAC of it under a key made at start-up
(`secrets`), so the server keeps no state per challenge: a nonce it did not make is
answered with a fresh challenge, one older than `NONCE_SECONDS` with `stale=true` (the
client answers again without asking its user). A nonce and nonce-count pair is taken once
(a bounded table): a replayed Authorization gets a fresh challenge. Every answer is checked
the same way, so how long a 403 takes tells nothing of which names are users: the users'
HA1s are made at start-up, and a name that is none (or an HA1 that cannot serve the
algorithm) is checked against a random HA1 of the same size, by the same hashing and the
same constant-time compare (`hmac.compare_digest`).

The file, JSON: `{"realm": "agent.example.com", "users": {"alice": "password",
"bob": {"ha1": "<hex MD5 of bob:realm:password>"}}}`. A user given by HA1 alone can answer
the MD5 challenge only (HA1 is the algorithm's hash); a password answers either. The hashing
is digest.py's, the same the agent's own requests use; the server side is ours for the
reason digest.py gives (HTTP libraries keep it inside their request flow, none reads SIP).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from signaling.sip.digest import parse_params, response_from_ha1, user_hash
from signaling.sip.message import SipRequest

NONCE_SECONDS = 300.0
SEEN_NONCES = 8192  # nonce+nc pairs remembered against replays
# In the order challenged: MD5 first, since many callers (sipp, older phones) answer the first
# WWW-Authenticate only and know MD5 alone; a client that knows SHA-256 picks it anyway (RFC
# 8760 §2.4 leaves the choice to the client), and an attacker gains nothing by the order.
ALGORITHMS = ("MD5", "SHA-256")
EXEMPT_METHODS = frozenset({"ACK", "CANCEL", "OPTIONS"})
HASH_BYTES = {"MD5": 16, "SHA-256": 32}


@dataclass(frozen=True)
class AuthUser:
    name: str
    password: str | None = field(default=None, repr=False)
    ha1: str | None = field(default=None, repr=False)  # MD5 HA1, lower-case hex

    def ha1_for(self, algorithm: str, realm: str) -> str | None:
        if self.password is not None:
            return user_hash(algorithm, self.name, realm, self.password)
        return self.ha1 if algorithm == "MD5" else None


@dataclass(frozen=True)
class CallerAuthSettings:
    realm: str
    users: Mapping[str, AuthUser]

    def __repr__(self) -> str:  # never a credential in logs
        return f"CallerAuthSettings(realm={self.realm!r}, users={len(self.users)})"


def load_auth_file(path: str) -> CallerAuthSettings:
    """Read `--sip-auth-file`; ValueError naming what is wrong (never the file's text)."""
    where = f"--sip-auth-file {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{where}: cannot read it ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{where}: not a JSON file") from None
    if not isinstance(data, dict) or set(data) - {"realm", "users"}:
        raise ValueError(f'{where}: must be an object with "realm" and "users" only')
    realm = data.get("realm")
    if not isinstance(realm, str) or not realm or '"' in realm or "\\" in realm:
        raise ValueError(f'{where}: "realm" must be a non-empty string without quotes')
    users = data.get("users")
    if not isinstance(users, dict) or not users:
        raise ValueError(f'{where}: "users" must be a non-empty object')
    parsed: dict[str, AuthUser] = {}
    for name, entry in users.items():
        if not name or any(ch in name for ch in '"\\:\r\n'):
            raise ValueError(f"{where}: user names must be non-empty, without quotes or ':'")
        if isinstance(entry, str) and entry:
            parsed[name] = AuthUser(name, password=entry)
        elif (isinstance(entry, dict) and set(entry) == {"ha1"} and isinstance(entry["ha1"], str)
              and len(entry["ha1"]) == 32 and all(c in "0123456789abcdefABCDEF"
                                                  for c in entry["ha1"])):
            parsed[name] = AuthUser(name, ha1=entry["ha1"].lower())
        else:
            raise ValueError(f'{where}: user {name!r} must be a password string or '
                             '{"ha1": "<32 hex digits>"}')
    return CallerAuthSettings(realm, parsed)


@dataclass(frozen=True)
class Refusal:
    """What a request that did not authenticate gets: 401 with challenges, or 403."""

    status: int
    headers: list[tuple[str, str]]
    code: str  # counted: auth_challenged, auth_stale, auth_failed

    @property
    def reason(self) -> str:
        return "Unauthorized" if self.status == 401 else "Forbidden"


class CallerAuth:
    def __init__(self, settings: CallerAuthSettings, *, nonce_seconds: float = NONCE_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.nonce_seconds = nonce_seconds
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Every user's HA1 for each algorithm it can answer, made once: a check is then the
        # same lookup, hashing and compare for every name. An answer naming no user (or an
        # algorithm its HA1 cannot serve) is checked against a random HA1 of the same size.
        self._ha1: dict[tuple[str, str], str] = {}
        for user in settings.users.values():
            for algorithm in ALGORITHMS:
                ha1 = user.ha1_for(algorithm, settings.realm)
                if ha1 is not None:
                    self._ha1[(user.name, algorithm)] = ha1
        self._dummy_ha1 = {algorithm: secrets.token_hex(HASH_BYTES[algorithm])
                           for algorithm in ALGORITHMS}

    # -- nonces -----------------------------------------------------------------------------

    def _mac(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def new_nonce(self) -> str:
        stamp = format(int(self._clock()), "x")
        return f"{stamp}.{self._mac(stamp)}"

    def _nonce_age(self, nonce: str) -> float | None:
        """Seconds since we issued `nonce`; None when we did not."""
        stamp, dot, mac = nonce.partition(".")
        if not dot or len(stamp) > 16 or not hmac.compare_digest(mac, self._mac(stamp)):
            return None
        try:
            return self._clock() - int(stamp, 16)
        except ValueError:
            return None

    def challenge(self, stale: bool = False) -> Refusal:
        nonce = self.new_nonce()
        values = [f'Digest realm="{self.settings.realm}", nonce="{nonce}", '
                  f'algorithm={algorithm}, qop="auth"' + (", stale=true" if stale else "")
                  for algorithm in ALGORITHMS]
        return Refusal(401, [("WWW-Authenticate", value) for value in values],
                       "auth_stale" if stale else "auth_challenged")

    # -- checking a request -----------------------------------------------------------------

    def check(self, request: SipRequest) -> Refusal | None:
        """None when `request` carries a valid answer (or need not), else its refusal."""
        if request.method in EXEMPT_METHODS:
            return None
        answers = [value for value in request.headers.lines("authorization")
                   if value.strip()[:7].lower() == "digest "]
        if not answers:
            return self.challenge()
        params = parse_params(answers[0].strip()[7:])
        if params is None:
            return Refusal(403, [], "auth_failed")
        nonce = params.get("nonce", "")
        age = self._nonce_age(nonce)
        if age is None:
            return self.challenge()  # not our nonce (an old server's, or made up)
        if not self._valid(request, params):
            return Refusal(403, [], "auth_failed")
        if age > self.nonce_seconds or age < -5:
            return self.challenge(stale=True)
        seen = (nonce, params.get("nc", ""))
        if seen in self._seen:
            return self.challenge(stale=True)  # a replayed Authorization
        self._seen[seen] = None
        while len(self._seen) > SEEN_NONCES:
            self._seen.popitem(last=False)
        return None

    def _valid(self, request: SipRequest, params: dict[str, str]) -> bool:
        """Whether `params` answer for `request`. Every answer takes the same path, whatever
        is wrong with it: an unknown user (or one whose HA1 cannot serve the algorithm) is
        checked against a dummy user's HA1 made the same way, and the response is always
        compared in constant time, so how long a refusal takes does not tell which names
        are users."""
        settings = self.settings
        algorithm = params.get("algorithm", "MD5").upper()
        qop = params.get("qop")
        nc_text, cnonce = params.get("nc", "0"), params.get("cnonce", "")
        fields_ok = (params.get("realm") == settings.realm and algorithm in ALGORITHMS
                     and params.get("uri") == request.uri and qop in (None, "auth")
                     and not (qop and (not cnonce or len(nc_text) != 8)))
        hashed = algorithm if algorithm in ALGORITHMS else "MD5"
        ha1 = self._ha1.get((params.get("username", ""), hashed))
        known = ha1 is not None
        if ha1 is None:
            ha1 = self._dummy_ha1[hashed]
        try:
            nc = int(nc_text, 16)
        except ValueError:
            nc, fields_ok = 0, False
        expected = response_from_ha1(hashed, ha1, params["nonce"], request.method,
                                     params.get("uri", ""), qop, nc, cnonce)
        matches = hmac.compare_digest(expected, params.get("response", "").lower())
        return matches and known and fields_ok
