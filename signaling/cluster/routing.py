"""The cluster's middleware: every request reaches the node that owns what it names.

Outermost of all (before the workers' routing, CORS and auth), for each request:
- **from another node** (signed, signing.py): checked, then handled here as any request of
  this node (the workers' routing takes it to the owning worker); never sent on again, so
  a request makes one hop at most;
- **a call or leg id naming another node**: forwarded there (forwarding.py); a node that is
  not in the table (dead: its record expired) or does not answer means its calls are gone:
  404 `call_not_found`;
- **a new call** (`POST /v1/realtime/calls`, `/offer`, `/v1/telephony/rtp`,
  `/v1/sip/calls`): placed by one atomic script (scripts.PLACE: the key's
  `--max-calls-per-key`, the least loaded serving node with room, for an outbound SIP call
  one that serves SIP, a slot taken there), then made here or forwarded to the chosen node
  before any answer is built (a WebRTC answer carries the owner's ICE candidates); the slot
  then becomes the call (scripts.SETTLE). With Redis down a node admits by its own capacity
  and each key gets its share of the limit here (the limit over the nodes in the table);
- a new call made with an **ephemeral secret** redeems it in Redis first (secrets.py).
"""

from __future__ import annotations

import json
import logging
import math
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

from agent.errors import AgentError
from agent.worker_tag import ID_TOKEN_CHARS, TAGS, made_here, node_of
from signaling import owned_routes
from signaling.auth import (
    AUTH_SETTINGS_KEY,
    SECRET_PREFIX,
    SECRET_TOKEN_CHARS,
    SECRETS_KEY,
    Principal,
    is_public,
    match_key,
    tenant_of,
)
from signaling.call_limit import pending_calls
from signaling.calls import CALLS_PATH
from signaling.cluster.forwarding import NodeUnreachable, with_body
from signaling.cluster.node import CLUSTER_KEY, ClusterNode
from signaling.cluster.registry import tenant_name, tenant_of_leg
from signaling.cluster.secrets import Redeemed
from signaling.cluster.signing import FROM_HEADER
from signaling.cluster.sockets import FROM_NODE_KEY
from signaling.cluster.store import StoreDown
from signaling.cors import with_cors_headers
from signaling.errors import ApiError, error_response, json_error
from signaling.keys import AGENT_KEY
from signaling.sip.outbound_api import SIP_CALLS_PATH
from signaling.slow_clients import read_body_in_time
from signaling.workers.channel import carries_body, from_a_worker
from signaling.workers.routing import is_new_leg

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# A call's or leg's own routes (hang-up, DTMF, accept, reject, ...), as the modules that
# register them declare them (owned_routes.py): its owner answers them (group 1: its id).
CALL_PATHS = owned_routes.PATHS
HOLD_MS = 30_000  # a placed slot not yet a call is counted this long at most
SECRETS_PATH = "/v1/realtime/client_secrets"


def _token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _secret(request: web.Request) -> str | None:
    token = _token(request)
    return token if token is not None and token.startswith(SECRET_PREFIX) else None


def is_new_call(request: web.Request) -> bool:
    """A request that makes a call: a new leg, or an outbound SIP call."""
    return is_new_leg(request) or (request.method == "POST" and request.path == SIP_CALLS_PATH)


def owner_node(request: web.Request) -> str | None:
    """The node a request's call or leg id names, where it names one."""
    for pattern in CALL_PATHS:
        match = pattern.match(request.path)
        if match:
            return node_of(match.group(1), ID_TOKEN_CHARS)
    return None


def call_id_of(response: web.StreamResponse) -> str:
    """The id of the call a successful new-call answer made ('' where none)."""
    if response.status not in (200, 201):
        return ""
    location = response.headers.get("Location", "")
    if location:
        return location.rstrip("/").rsplit("/", 1)[-1]
    body = getattr(response, "body", None)
    if isinstance(body, bytes):
        try:
            answer = json.loads(body)
        except ValueError:
            return ""
        call = answer.get("call_id") if isinstance(answer, dict) else None
        if isinstance(call, str):
            return call
    return ""


async def _body(request: web.Request) -> bytes:
    return await read_body_in_time(request) if carries_body(request) else b""


async def forward_to(node: ClusterNode, request: web.Request, tag: str, body: bytes,
                     kind: str, placed: str = "") -> web.Response:
    """NodeUnreachable where the node is unknown or does not answer."""
    address = node.table.address_of(tag)
    if address is None and node.store.usable:
        await node.heartbeat.beat(full=False)  # a node that joined since the last heartbeat
        address = node.table.address_of(tag)
    if address is None:
        raise NodeUnreachable(f"node {tag} is not in the table")
    response, took = await node.forwarder.send(request, address, body, tag, placed)
    node.metrics.forwarded.labels(kind).inc()
    node.metrics.forward_seconds.observe(took)
    return response


async def control(node: ClusterNode, request: web.Request, tag: str) -> web.Response:
    """A request about another node's call: its owner's answer."""
    try:
        return await forward_to(node, request, tag, await _body(request), "control")
    except NodeUnreachable as exc:
        log.info("call on node %s: %s; answering call_not_found", tag, exc)
        raise ApiError("call_not_found", "no such call (its node is gone)", param="call_id",
                       status=404) from None


def may_be_forwarded(request: web.Request) -> bool:
    """Nothing goes to another node before its credential is checked here (API keys are the
    same on every node; a secret is checked where the call is): a request without one is
    refused here, by this node's own auth."""
    settings = request.app[AUTH_SETTINGS_KEY]
    if settings.open or is_public(request):
        return True
    token = _token(request)
    if token is None:
        return False
    return token.startswith(SECRET_PREFIX) or (
        match_key(token, settings.admin_keys) or match_key(token, settings.api_keys)
    ) is not None


async def tenant(node: ClusterNode, request: web.Request) -> str | None:
    """The tenant a new call would count against; None where the credential is not good
    (the handler refuses it with its own code)."""
    settings = request.app[AUTH_SETTINGS_KEY]
    token = _token(request)
    if token is not None and token.startswith(SECRET_PREFIX):
        local = request.app[SECRETS_KEY].find(token, request.app[AGENT_KEY].legs)
        if local is not None:
            return tenant_name(local.tenant)
        known = await node.secrets.tenant_of(token)
        return known[1] if known is not None and known[0] == "unused" else None
    if settings.open:
        return tenant_name(None)
    if token is None:
        return None
    key = match_key(token, settings.admin_keys) or match_key(token, settings.api_keys)
    return None if key is None else tenant_of(key)


def tenant_refusal(limit: int) -> ApiError:
    return ApiError("tenant_limit", f"this key already holds {limit} concurrent calls "
                    "(--max-calls-per-key); end one or retry later",
                    headers={"Retry-After": "5"}, status=429)


def check_share_here(node: ClusterNode, request: web.Request, who: str) -> None:
    """Redis down: the key's share of its limit on this node."""
    limit = node.settings.max_calls_per_key
    if not limit:
        return
    serving = sum(1 for n in node.table.nodes.values() if n.state == "serving") or 1
    share = max(1, math.ceil(limit / serving))
    held = sum(1 for leg in request.app[AGENT_KEY].legs if tenant_of_leg(leg.owner) == who)
    held += sum(1 for owner in pending_calls(request.app).values()
                if tenant_of_leg(owner) == who)  # ringing outbound SIP calls
    if held >= share:
        raise tenant_refusal(share)


async def handle_here(node: ClusterNode, request: web.Request, handler: Handler,
                      from_worker: bool = False) -> web.StreamResponse:
    """Handle `request` on this node; a new call's secret is redeemed first."""
    if is_new_call(request):
        return noted(node, request, await _handle_here(node, request, handler, from_worker))
    response = await _handle_here(node, request, handler, from_worker)
    if request.method in ("DELETE", "POST") and owner_node(request) is not None:
        # a call hung up here frees its slot in the cluster before the answer goes out,
        # so the caller's next call sees it free
        await node.heartbeat.send_changes()
    return response


def noted(node: ClusterNode, request: web.Request, response: web.StreamResponse
          ) -> web.StreamResponse:
    """A call this process just made is this process's to take out of Redis when it ends,
    however short it is (the node that placed it counts it there before answering)."""
    call = call_id_of(response)
    if call and made_here(call, ID_TOKEN_CHARS):
        principal = request.get("principal")
        node.heartbeat.published.setdefault(
            call, tenant_name(principal.tenant) if isinstance(principal, Principal) else "")
    return response


async def _handle_here(node: ClusterNode, request: web.Request, handler: Handler,
                       from_worker: bool) -> web.StreamResponse:
    value = _secret(request)
    if value is None:
        return await handler(request)
    if not (request.method == "POST" and request.path == CALLS_PATH):
        if request.app[SECRETS_KEY].knows(value) or not await node.secrets.peek(request, value):
            return await handler(request)
        try:  # known for this request only (it counts as unused where it was minted)
            return await handler(request)
        finally:
            request.app[SECRETS_KEY].forget(value)
    store = request.app[SECRETS_KEY]
    if from_worker:  # redeemed by the worker that passed it here
        adopted = not store.knows(value) and await node.secrets.peek(request, value,
                                                                      used_ok=True)
        try:
            return await handler(request)
        finally:
            if adopted:  # no call made here: the copy goes (the other worker gives it back)
                store.let_go(value)
    minted_here = node_of(value, SECRET_TOKEN_CHARS) == node.tag
    redeemed = await node.secrets.redeem(request, value, minted_here)
    if redeemed is Redeemed.ELSEWHERE:
        tag = node_of(value, SECRET_TOKEN_CHARS) or ""
        try:
            return await forward_to(node, request, tag, await _body(request), "secret")
        except NodeUnreachable:
            raise ApiError("invalid_secret", "unknown or expired ephemeral secret",
                           headers={"WWW-Authenticate": "Bearer"}, status=401) from None
    try:
        response = await handler(request)
    finally:
        if redeemed is Redeemed.HERE:
            # The copy adopted by redeeming stays only bound to a call made here: a call the
            # handler passed to another worker is that worker's (it adopts the secret), and
            # a copy left unbound here would count as unused until it expired.
            store.let_go(value)
    if redeemed is Redeemed.HERE and response.status not in (200, 201):
        await node.secrets.give_back(value)
    return response


async def place(node: ClusterNode, request: web.Request, handler: Handler
                ) -> web.StreamResponse:
    who = await tenant(node, request)
    if who is None:
        return await handle_here(node, request, handler)
    await node.heartbeat.send_state()  # a drain just begun leaves placement first
    member = "r:" + secrets.token_urlsafe(12)
    need_sip = request.path == SIP_CALLS_PATH
    answer: list[str] = []
    if node.store.usable:
        try:
            answer = list(await node.store.run(
                "PLACE", tags=TAGS, entry=node.tag, member=member, hold=HOLD_MS, tenant=who,
                tenant_limit=node.settings.max_calls_per_key, need_sip=need_sip,
                ttl=int(node.settings.ttl_s * 1000)))
        except StoreDown:
            answer = []
    if not answer:
        node.metrics.placements.labels("fallback_here").inc()
        check_share_here(node, request, who)
        if need_sip and not serves_sip(node):
            return await sip_elsewhere(node, request)
        return await handle_here(node, request, handler)
    if answer[0] == "no_sip":
        raise no_sip_node()
    if answer[0] == "tenant_limit":
        node.metrics.placements.labels("tenant_limit").inc()
        raise tenant_refusal(node.settings.max_calls_per_key)
    if answer[0] == "full":
        node.metrics.placements.labels("full").inc()
        request.app[AGENT_KEY].metrics.refused("server_full")
        raise ApiError("server_full", "every node of the cluster is full; retry later",
                       status=503)
    chosen, owner = answer[1], node.tag
    call = ""
    try:
        if chosen == node.tag:
            node.metrics.placements.labels("here").inc()
            response = await handle_here(node, request, handler)
        else:
            body = await _body(request)
            try:
                response = await forward_to(node, request, chosen, body, "placement", member)
                node.metrics.placements.labels("forwarded").inc()
                owner = chosen
            except NodeUnreachable:  # gone since its last heartbeat: made here instead
                node.metrics.placements.labels("here_instead").inc()
                response = await handle_here(node, with_body(request, body), handler)
        call = call_id_of(response)
        return response
    finally:
        try:
            await node.store.run("SETTLE", node=chosen, owner=owner, member=member, call=call,
                                 tenant=who, ttl=int(node.settings.ttl_s * 1000))
        except StoreDown:
            pass  # the slot expires by itself; the owner's heartbeat counts the call


async def route(node: ClusterNode, request: web.Request, handler: Handler
                ) -> web.StreamResponse:
    if from_a_worker(request):  # this node's worker passed it on: handled there so far
        return await handle_here(node, request, handler, from_worker=True)
    if FROM_HEADER in request.headers:
        body = await read_body_in_time(request)
        # right, fresh, signed for this node and not seen before: else 403, 421 or 409
        sender = await node.forwarder.gate.admit(request.headers, request.method,
                                                 request.raw_path, body)
        request[FROM_NODE_KEY] = sender  # never carried on to a third node
        return await handle_here(node, with_body(request, body), handler)
    tag = owner_node(request)
    if tag is not None and tag != node.tag and may_be_forwarded(request):
        return await control(node, request, tag)
    if is_new_call(request):
        return await place(node, request, handler)
    if request.method == "POST" and request.path == SECRETS_PATH:
        response = await handler(request)
        if response.status == 200 and isinstance(response, web.Response) and isinstance(
                response.body, bytes):
            principal = request.get("principal")
            await node.secrets.publish(request, json.loads(response.body),
                                       getattr(principal, "tenant", None))
        return response
    if request.method == "GET" and request.path == "/health":
        return with_cluster_view(node, await handle_here(node, request, handler))
    return await handle_here(node, request, handler)


def serves_sip(node: ClusterNode) -> bool:
    here = node.table.nodes.get(node.tag)
    return here is not None and here.sip


def no_sip_node() -> ApiError:
    return ApiError("sip_not_running", "no node of the cluster serves SIP (--sip-listen)",
                    status=503)


async def sip_elsewhere(node: ClusterNode, request: web.Request) -> web.Response:
    """Redis down and no SIP here: an outbound SIP call goes to a serving node with SIP as
    the node table last showed it (that node admits it by its own capacity)."""
    body = await _body(request)
    for other in sorted(node.table.nodes.values(), key=lambda n: n.calls):
        if other.sip and other.state == "serving" and other.tag != node.tag:
            try:
                return await forward_to(node, request, other.tag, body, "placement")
            except NodeUnreachable:
                continue
    raise no_sip_node()


def with_cluster_view(node: ClusterNode, response: web.StreamResponse) -> web.StreamResponse:
    """`/health` (the workers' merged view, where there are several) with the cluster as
    this node sees it."""
    if response.status != 200 or not isinstance(response, web.Response) or not isinstance(
            response.body, bytes):
        return response
    try:
        health = json.loads(response.body)
    except ValueError:
        return response
    health["cluster"] = node.view()
    answer = web.json_response(health)
    for name, value in response.headers.items():
        if name.lower().startswith("access-control-"):
            answer.headers.add(name, value)
    return answer


@web.middleware
async def cluster_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await route(request.app[CLUSTER_KEY], request, handler)
    except AgentError as exc:  # outside the error and CORS middlewares: refusals made here
        refusal = with_cors_headers(request, error_response(exc))
        if exc.code == "body_timeout":
            refusal.force_close()  # the rest of the body is not worth waiting for
        return refusal
    except web.HTTPRequestEntityTooLarge:  # a body read here to forward or check it
        return with_cors_headers(request, json_error(
            413, "body_too_large",
            f"request bodies are limited to {request.client_max_size} bytes"))


def install(app: web.Application) -> None:
    app.middlewares.insert(0, cluster_middleware)
