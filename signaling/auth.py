"""Bearer auth: server API keys and short-lived, single-use ephemeral secrets (`ek_...`).

With `--api-key` (repeatable, or env `AGENT_API_KEY`), every route except the public ones
(`/`, `/static/`, `/health`, CORS preflight) needs `Authorization: Bearer <key>`; keys are
compared in constant time. A key holder mints ephemeral secrets at
`POST /v1/realtime/client_secrets`. A secret:
- creates exactly one call (`POST /v1/realtime/calls`), with the session config bound to it
  at mint time; a second use, or a use after its TTL, gets 401;
- afterwards may manage (hang up, trickle to) only the call it created, for as long as that
  call lives;
- may read `GET /v1/models` and `GET /v1/realtime/config`, and nothing else (403 elsewhere;
  in particular a secret cannot mint secrets).

Limits: a key (or, on an open server, everyone together) may hold `--max-secrets-per-key`
unused secrets at once (429 `too_many_secrets` beyond); a secret bound to a live call is
never forgotten while the call lives, however many are minted meanwhile. With several
workers the limit is the server's: each worker counts its unused secrets per key in the
workers' shared tally (workers/tally.py), and a mint that would take a key past the limit
anywhere is refused (another worker's expired secrets count until it next prunes, within
a second).

Ownership: a call belongs to the credential that created it. A key may manage the calls
made with it and with the secrets it minted; a secret only its own call; anyone else gets
404. With no key configured the server is open (everyone is the same anonymous owner), but a
presented `ek_` secret is still honoured (bound config, single use), so a browser page
written for the secured flow works unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from agent.plugins.base import SessionConfig
from agent.realtime.session_config import session_config_from_realtime
from agent.worker_tag import tagged_token, token_chars
from signaling.address_limit import mark_authenticated
from signaling.errors import ApiError, error_response, read_json_object
from signaling.keys import AGENT_KEY

API_KEY_ENV = "AGENT_API_KEY"
SECRET_PREFIX = "ek_"
SECRET_TOKEN_BYTES = 24
SECRET_TOKEN_CHARS = token_chars(SECRET_TOKEN_BYTES)
DEFAULT_SECRET_TTL = 60.0
MAX_SECRET_TTL = 3600.0
MAX_LIVE_SECRETS = 10_000
DEFAULT_MAX_SECRETS_PER_KEY = 1000  # unused at once; ~16 mints/s for the default 60 s TTL
PUBLIC_PATHS = frozenset({"/", "/health", "/health/live", "/health/ready"})
PUBLIC_PREFIXES = ("/static/",)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class AuthSettings:
    api_keys: tuple[str, ...] = ()
    # Operator keys: valid wherever an API key is, and see and manage every tenant's calls.
    admin_keys: tuple[str, ...] = ()
    secret_ttl_seconds: float = DEFAULT_SECRET_TTL
    max_secrets_per_key: int = DEFAULT_MAX_SECRETS_PER_KEY

    @property
    def open(self) -> bool:
        return not self.api_keys and not self.admin_keys


@dataclass
class EphemeralSecret:
    value_hash: bytes
    tenant: str | None
    expires_at: float  # unix time
    session: SessionConfig | None
    in_use: bool = False  # a call is being created with it, or was
    call_id: str | None = None

    def expired(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) >= self.expires_at


def _hash(value: str) -> bytes:
    # Secrets are looked up by hash so a dict probe never compares the secret itself.
    return hashlib.sha256(value.encode("utf-8", "replace")).digest()


class SharedCounts(Protocol):
    """Counts kept together with other processes (signaling/workers/tally.SharedTally)."""

    def claim(self, key: int, value_here: int, limit: int) -> bool | None: ...

    def replace_here(self, values: Mapping[int, int]) -> None: ...


class SecretStore:
    """Live ephemeral secrets, looked up by hash.

    Every lookup is one hash and one dict probe, whether the secret is known or not, so
    refusing an unknown one costs no more than accepting a known one, and neither depends
    on how many are stored. Forgetting dead secrets (a full scan) happens when minting and
    at most once per PRUNE_INTERVAL on lookups, never per request.
    """

    PRUNE_INTERVAL = 1.0

    def __init__(self, max_per_tenant: int = DEFAULT_MAX_SECRETS_PER_KEY) -> None:
        self._secrets: dict[bytes, EphemeralSecret] = {}
        self.max_per_tenant = max_per_tenant
        self._next_prune = 0.0
        self._shared: SharedCounts | None = None
        self._key_of: Callable[[str], int] = lambda tenant: 0

    def share(self, shared: SharedCounts | None, key_of: Callable[[str], int]) -> None:
        """Count unused secrets against the server's limit in `shared` (several workers;
        None: no longer)."""
        self._shared, self._key_of = shared, key_of

    def _unclaimed_by_tenant(self) -> Counter[str]:
        return Counter(str(s.tenant) for s in self._secrets.values() if s.call_id is None)

    def publish(self) -> None:
        """Tell the other workers how many unused secrets each key holds here."""
        if self._shared is not None:
            self._shared.replace_here({self._key_of(tenant): count for tenant, count
                                       in self._unclaimed_by_tenant().items()})

    def _within_limit(self, tenant: str | None, unclaimed: int) -> bool:
        if unclaimed >= self.max_per_tenant:
            return False
        if self._shared is None:
            return True
        return self._shared.claim(self._key_of(str(tenant)), unclaimed + 1,
                                  self.max_per_tenant) is not False

    def mint(self, tenant: str | None, ttl: float, session: SessionConfig | None,
             live_calls: Container[str]) -> tuple[str, EphemeralSecret]:
        # Prune with the live calls: a secret bound to a live call still hangs it up.
        self.prune(live_calls)
        unclaimed = sum(1 for s in self._secrets.values()
                        if s.tenant == tenant and s.call_id is None)
        if not self._within_limit(tenant, unclaimed):
            # One key's unused secrets must not fill the store for every other key.
            raise ApiError("too_many_secrets",
                           f"this key already has {self.max_per_tenant} unused ephemeral "
                           "secrets (--max-secrets-per-key); let some expire or use them",
                           headers={"Retry-After": "5"}, status=429)
        if len(self._secrets) >= MAX_LIVE_SECRETS:
            raise ApiError("too_many_secrets", "too many unexpired secrets; retry later",
                           headers={"Retry-After": "5"}, status=503)
        value = SECRET_PREFIX + tagged_token(SECRET_TOKEN_BYTES)
        secret = EphemeralSecret(_hash(value), tenant, time.time() + ttl, session)
        self._secrets[secret.value_hash] = secret
        return value, secret

    def find(self, value: str, live_calls: Container[str]) -> EphemeralSecret | None:
        """The secret that can still do something, or None (unknown, or its call ended)."""
        now = time.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + self.PRUNE_INTERVAL
            self.prune(live_calls)
        secret = self._secrets.get(_hash(value))
        if secret is not None and secret.call_id is not None and secret.call_id not in live_calls:
            return None  # spent: its call is over
        return secret

    def prune(self, live_calls: Container[str]) -> None:
        """Forget secrets that can no longer do anything."""
        now = time.time()
        for key, secret in list(self._secrets.items()):
            spent = secret.call_id is not None and secret.call_id not in live_calls
            if spent or (secret.expired(now) and secret.call_id is None and not secret.in_use):
                del self._secrets[key]
        self.publish()

    def __len__(self) -> int:
        return len(self._secrets)

    def knows(self, value: str) -> bool:
        return _hash(value) in self._secrets

    def adopt(self, value: str, tenant: str | None, expires_at: float,
              session: SessionConfig | None, in_use: bool) -> EphemeralSecret:
        """A secret minted elsewhere (a cluster's shared store said so), known here from now
        on; one already known here is kept as it is."""
        known = self._secrets.get(_hash(value))
        if known is not None:
            return known
        secret = EphemeralSecret(_hash(value), tenant, expires_at, session, in_use=in_use)
        self._secrets[secret.value_hash] = secret
        return secret

    def forget(self, value: str) -> None:
        """Forget a secret here (a cluster's shared store holds it); one that was unused here
        stops counting for the other workers at once, not at the next refresh."""
        secret = self._secrets.pop(_hash(value), None)
        if secret is not None and secret.call_id is None:
            self.publish()

    def let_go(self, value: str) -> None:
        """Forget a secret adopted for a new call unless that call was made here: made by
        another worker (which adopted the secret itself) or not at all, a copy left here
        would count as unused until it expired."""
        secret = self._secrets.get(_hash(value))
        if secret is not None and secret.call_id is None:
            self.forget(value)


@dataclass(frozen=True)
class Principal:
    """Who is asking: the anonymous user of an open server, a key holder, or a secret."""

    kind: str  # "open" | "key" | "secret"
    tenant: str | None = None
    secret: EphemeralSecret | None = field(default=None, compare=False)
    operator: bool = False  # an --admin-key: every tenant's calls

    def may_manage(self, owner: Principal) -> bool:
        if self.operator:
            return True
        if self.secret is not None:
            return owner.secret is self.secret
        return owner.tenant == self.tenant

    def consume(self) -> None:
        """Spend a secret on the call being created (no-op for keys)."""
        if self.secret is None:
            return
        if self.secret.in_use:
            raise ApiError("secret_used", "this ephemeral secret was already used", status=401)
        if self.secret.expired():
            raise ApiError("secret_expired", "this ephemeral secret has expired", status=401)
        self.secret.in_use = True

    def release(self) -> None:
        """The call could not be created: the secret stays usable."""
        if self.secret is not None and self.secret.call_id is None:
            self.secret.in_use = False

    def claim(self, call_id: str) -> None:
        if self.secret is not None:
            self.secret.call_id = call_id


OPEN = Principal("open")

AUTH_SETTINGS_KEY = web.AppKey("auth_settings", AuthSettings)
SECRETS_KEY = web.AppKey("secrets", SecretStore)
PRINCIPAL = "principal"


def tenant_of(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError("invalid_authorization",
                       "the Authorization header must be 'Bearer <key>'", status=401)
    return token.strip()


def match_key(token: str, keys: tuple[str, ...]) -> str | None:
    """The key equal to `token`, compared in constant time against every key."""
    found = None
    candidate = token.encode("utf-8", "replace")
    for key in keys:
        if hmac.compare_digest(candidate, key.encode("utf-8")):
            found = key
    return found


def secret_may_use(request: web.Request) -> bool:
    path, method = request.path, request.method
    if method == "GET" and path in ("/v1/models", "/v1/realtime/config"):
        return True
    if path == "/v1/realtime/calls":
        return method == "POST"
    return path.startswith("/v1/realtime/calls/")


def authenticate(request: web.Request) -> Principal:
    settings = request.app[AUTH_SETTINGS_KEY]
    token = bearer_token(request) if not settings.open else _open_token(request)
    if token is None:
        if settings.open:
            return OPEN
        raise ApiError("missing_api_key", "this server needs 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"}, status=401)
    if not settings.open:
        admin = match_key(token, settings.admin_keys)
        if admin is not None:
            return Principal("key", tenant_of(admin), operator=True)
        key = match_key(token, settings.api_keys)
        if key is not None:
            return Principal("key", tenant_of(key))
    if token.startswith(SECRET_PREFIX):
        secret = request.app[SECRETS_KEY].find(token, request.app[AGENT_KEY].legs)
        if secret is not None:
            if not secret_may_use(request):
                raise ApiError("secret_not_allowed",
                               "an ephemeral secret may only create and manage its own call",
                               status=403)
            if secret.call_id is None and secret.expired():
                raise ApiError("secret_expired", "this ephemeral secret has expired",
                               headers={"WWW-Authenticate": "Bearer"}, status=401)
            return Principal("secret", secret.tenant, secret)
        raise ApiError("invalid_secret", "unknown or expired ephemeral secret",
                       headers={"WWW-Authenticate": "Bearer"}, status=401)
    raise ApiError("invalid_api_key", "the API key is not valid",
                   headers={"WWW-Authenticate": "Bearer"}, status=401)


def _open_token(request: web.Request) -> str | None:
    # An open server ignores keys (clients may send whatever they use elsewhere) but still
    # honours, or refuses, an ephemeral secret it is shown.
    try:
        token = bearer_token(request)
    except ApiError:
        return None
    return token if token and token.startswith(SECRET_PREFIX) else None


def is_public(request: web.Request) -> bool:
    return (
        request.method == "OPTIONS"
        or request.path in PUBLIC_PATHS
        or request.path.startswith(PUBLIC_PREFIXES)
    )


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if is_public(request):
        request[PRINCIPAL] = OPEN
        return await handler(request)
    try:
        request[PRINCIPAL] = authenticate(request)
    except ApiError as exc:
        return error_response(exc)
    mark_authenticated(request)
    return await handler(request)


def principal_of(request: web.Request) -> Principal:
    return request.get(PRINCIPAL, OPEN)


def secret_session(request: web.Request) -> SessionConfig | None:
    secret = principal_of(request).secret
    return secret.session if secret is not None else None


# -- POST /v1/realtime/client_secrets -----------------------------------------------------


def _ttl_from(body: dict[str, Any], default: float) -> float:
    expires_after = body.get("expires_after")
    if expires_after is None:
        return default
    if not isinstance(expires_after, dict):
        raise ApiError("invalid_type", "'expires_after' must be an object",
                       param="expires_after")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        raise ApiError("invalid_value", "'expires_after.anchor' must be \"created_at\"",
                       param="expires_after.anchor")
    seconds = expires_after.get("seconds", default)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ApiError("invalid_type", "'expires_after.seconds' must be a number",
                       param="expires_after.seconds")
    if not 1 <= seconds <= MAX_SECRET_TTL:
        raise ApiError("invalid_value",
                       f"'expires_after.seconds' must be between 1 and {MAX_SECRET_TTL:g}",
                       param="expires_after.seconds")
    return float(seconds)


async def post_client_secret(request: web.Request) -> web.Response:
    principal = principal_of(request)
    if principal.secret is not None:  # authenticate() refuses this already; belt and braces
        raise ApiError("secret_not_allowed", "an ephemeral secret cannot mint secrets", status=403)
    body: dict[str, Any] = {}
    if request.can_read_body:
        if request.content_type != "application/json":
            raise ApiError("unsupported_media_type", "send application/json", status=415)
        body = await read_json_object(request)
    ttl = _ttl_from(body, request.app[AUTH_SETTINGS_KEY].secret_ttl_seconds)
    session = None
    if body.get("session") is not None:
        session = session_config_from_realtime(body["session"], param="session")
        # Refuse a config the plugin would refuse now, not when the browser calls.
        await request.app[AGENT_KEY].plugin.validate_session_config(session)
    value, secret = request.app[SECRETS_KEY].mint(principal.tenant, ttl, session,
                                                  request.app[AGENT_KEY].legs)
    return web.json_response({
        "value": value,
        "expires_at": int(secret.expires_at),
        "session": session_description(session),
    })


def session_description(session: SessionConfig | None) -> dict[str, Any]:
    if session is None:
        return {"type": "realtime"}
    return {
        "type": "realtime",
        "voice": session.voice,
        "instructions": session.instructions,
        "extra_body": dict(session.extra_body),
    }


def setup(app: web.Application, settings: AuthSettings) -> None:
    app[AUTH_SETTINGS_KEY] = settings
    app[SECRETS_KEY] = SecretStore(settings.max_secrets_per_key)
    app.router.add_post("/v1/realtime/client_secrets", post_client_secret)


# -- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("auth")
    group.add_argument(
        "--api-key", action="append", default=None, metavar="KEY",
        help=f"require 'Authorization: Bearer KEY' (repeatable; default: env {API_KEY_ENV}; "
        "none: the server is open)",
    )
    group.add_argument(
        "--admin-key", action="append", default=None, metavar="KEY",
        help="an operator key (repeatable): accepted wherever an --api-key is, and sees and "
        "ends every tenant's calls and legs (/metrics/calls lists them all); API keys see "
        "only their own",
    )
    group.add_argument(
        "--secret-ttl", type=float, default=DEFAULT_SECRET_TTL, metavar="SECONDS",
        help=f"default lifetime of ephemeral secrets (default {DEFAULT_SECRET_TTL:g})",
    )
    group.add_argument(
        "--max-secrets-per-key", type=int, default=DEFAULT_MAX_SECRETS_PER_KEY, metavar="N",
        help="unused ephemeral secrets one key (or, without keys, all clients) may hold at "
        f"once; more get 429 too_many_secrets (default {DEFAULT_MAX_SECRETS_PER_KEY})",
    )


def settings_from_args(args: argparse.Namespace) -> AuthSettings:
    keys = list(args.api_key or [])
    if not keys and os.environ.get(API_KEY_ENV):
        keys = [os.environ[API_KEY_ENV]]
    keys = [k for k in keys if k]
    ttl = min(max(1.0, args.secret_ttl), MAX_SECRET_TTL)
    return AuthSettings(api_keys=tuple(keys), secret_ttl_seconds=ttl,
                        max_secrets_per_key=max(1, args.max_secrets_per_key),
                        admin_keys=tuple(k for k in (args.admin_key or []) if k))

