"""Ephemeral secrets shared by the cluster: minted on any node, redeemed on any node, once.

A node mints as it always has (signaling/auth.py: the bound session checked, its own
limits), then publishes the secret to Redis (scripts.MINT), where `--max-secrets-per-key`
is counted over the cluster: a mint past it is taken back here and refused with 429. A new
call made with a secret redeems it in Redis in one atomic step (scripts.SECRET, `redeem`):
of two nodes racing with the same secret exactly one wins, the other answers 401
`secret_used`. The winner adopts the secret into its own store, so the secret then manages
its call there (the call's later requests are forwarded to that node by its id).

While Redis is down a node mints secrets only it knows (their ids name it, so another node
forwards their use here), and refuses with 503 what needs the shared store: redeeming a
secret that lives in Redis.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from aiohttp import web

from agent.plugins.base import SessionConfig
from signaling.auth import AUTH_SETTINGS_KEY, SECRETS_KEY, SecretStore
from signaling.cluster.registry import tenant_name
from signaling.cluster.store import Store, StoreDown
from signaling.errors import ApiError

RETRY_AFTER = {"Retry-After": "2"}


def secret_hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "replace")).hexdigest()


class Redeemed(Enum):
    HERE = "here"  # adopted here: the call goes on here
    LOCAL = "local"  # not in the shared store, minted here: the local store decides
    ELSEWHERE = "elsewhere"  # not in the shared store, minted by another node


def unavailable(what: str) -> ApiError:
    return ApiError("cluster_unavailable", f"{what} needs the cluster's shared store, which "
                    "is unreachable; retry shortly", headers=RETRY_AFTER, status=503)


@dataclass
class ClusterSecrets:
    store: Store
    shared: set[str] = field(default_factory=set)  # hashes of secrets published from here

    async def publish(self, request: web.Request, minted: dict[str, Any],
                      tenant: str | None) -> None:
        """Share a secret this node just minted; ApiError 429 past the cluster's limit."""
        value = str(minted.get("value", ""))
        store: SecretStore = request.app[SECRETS_KEY]
        if not self.store.usable:
            return  # known here only (its id names this node)
        digest = secret_hash(value)
        try:
            answer = await self.store.run(
                "MINT", hash=digest, tenant=tenant_name(tenant), limit=store.max_per_tenant,
                expires=int(float(minted.get("expires_at", 0)) * 1000) + 999,
                session=json.dumps(minted.get("session") or {}))
        except StoreDown:
            return
        if answer[0] == "too_many_secrets":
            store.forget(value)
            limit = request.app[AUTH_SETTINGS_KEY].max_secrets_per_key
            raise ApiError("too_many_secrets",
                           f"this key already has {limit} unused ephemeral secrets across the "
                           "cluster (--max-secrets-per-key); let some expire or use them",
                           headers={"Retry-After": "5"}, status=429)
        self.shared.add(digest)
        store.forget(value)  # Redis holds it now: a use here reads it there (and counts there)

    async def _ask(self, op: str, value: str) -> list[Any]:
        answer = await self.store.run("SECRET", op=op, hash=secret_hash(value))
        return list(answer)

    async def peek(self, request: web.Request, value: str, *, used_ok: bool = False) -> bool:
        """Make an unused secret of the shared store known here without spending it (to read
        the config); False where the store does not have it, or it is spent."""
        store: SecretStore = request.app[SECRETS_KEY]
        if store.knows(value) or not self.store.usable:
            return store.knows(value)
        try:
            answer = await self._ask("peek", value)
        except StoreDown:
            return False
        # A secret spent elsewhere is that node's to judge (its call's requests go there);
        # spent here by the worker that passed a new call on, it makes that call here.
        if not (answer[0] == "unused" or (answer[0] == "used" and used_ok)):
            return False
        self._adopt(store, value, answer, in_use=False)
        return True

    async def tenant_of(self, value: str) -> tuple[str, str] | None:
        """(state, tenant) of a shared secret, None where unknown or the store is down."""
        if not self.store.usable:
            return None
        try:
            answer = await self._ask("peek", value)
        except StoreDown:
            return None
        if answer[0] not in ("unused", "used", "expired"):
            return None
        return str(answer[0]), str(answer[1]) if len(answer) > 1 else ""

    async def redeem(self, request: web.Request, value: str, minted_here: bool) -> Redeemed:
        """Spend a secret on the call this node is about to make (exactly once, cluster-
        wide): HERE once redeemed; ApiError 401 when spent or expired, 503 when only the
        unreachable store could say."""
        store: SecretStore = request.app[SECRETS_KEY]
        digest = secret_hash(value)
        if not self.store.usable:
            if minted_here and digest not in self.shared and store.knows(value):
                return Redeemed.LOCAL
            raise unavailable("redeeming this ephemeral secret")
        try:
            answer = await self._ask("redeem", value)
        except StoreDown:
            raise unavailable("redeeming this ephemeral secret") from None
        state = answer[0]
        if state == "unknown":
            return Redeemed.LOCAL if minted_here else Redeemed.ELSEWHERE
        if state == "used":
            raise ApiError("secret_used", "this ephemeral secret was already used", status=401)
        if state == "expired":
            raise ApiError("secret_expired", "this ephemeral secret has expired", status=401)
        store.forget(value)  # a copy minted here: Redis has spent it, this one starts fresh
        self._adopt(store, value, answer, in_use=False)
        return Redeemed.HERE

    async def give_back(self, value: str) -> None:
        """The call could not be made: the secret may be used again."""
        try:
            await self._ask("release", value)
        except StoreDown:
            pass

    @staticmethod
    def _adopt(store: SecretStore, value: str, answer: list[Any], in_use: bool) -> None:
        _, tenant, expires_ms, session_json = answer[:4]
        session = None
        try:
            described = json.loads(session_json or "{}")
        except ValueError:
            described = {}
        if isinstance(described, dict) and any(
                described.get(k) for k in ("voice", "instructions", "extra_body")):
            session = SessionConfig.from_json(
                {k: described.get(k) for k in ("voice", "instructions", "extra_body")})
        store.adopt(value, None if tenant == "open" else str(tenant),
                    min(float(expires_ms) / 1000, time.time() + 3600), session, in_use)
