"""A node's tag: the one character its ids start with, claimed in Redis at start-up.

The claim is the node's record itself (`P node:{tag}`, field `address` set only where it is
not): two nodes starting at once never get the same tag, a restarted node whose record is
still alive gets its own back, and a dead node's tag is free again one TTL after its last
heartbeat. The first claim lasts `STARTING_TTL_S` (workers still starting); the heartbeats
keep it from then on. Done before the workers start, with redis-py's blocking client (no
event loop runs yet); the workers read it from the environment.
"""

from __future__ import annotations

import hashlib
import os
import time

import redis
from redis.exceptions import RedisError

from agent.errors import AgentError
from agent.worker_tag import TAGS
from signaling.cluster.settings import ClusterSettings

TAG_ENV = "AGENT_CLUSTER_NODE_TAG"
STARTING_TTL_S = 30.0
CONNECT_TRIES_S = 10.0


class ClaimError(AgentError):
    """This node could not claim a tag (Redis unreachable, every tag taken): `code` says
    which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


def _order(address: str) -> str:
    """Every tag, starting at one picked by the address (so restarts tend to get theirs)."""
    start = hashlib.sha256(address.encode()).digest()[0] % len(TAGS)
    return TAGS[start:] + TAGS[:start]


def claim_tag(settings: ClusterSettings) -> str:
    """This node's tag (inherited from the supervisor, or claimed now)."""
    inherited = os.environ.get(TAG_ENV, "")
    if len(inherited) == 1 and inherited in TAGS:
        return inherited
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=2,
                                  socket_connect_timeout=2)
    deadline = time.monotonic() + CONNECT_TRIES_S
    try:
        while True:
            try:
                return _claim(client, settings)
            except RedisError as exc:
                if time.monotonic() >= deadline:
                    raise ClaimError("cluster_unreachable",
                                     f"--cluster: cannot reach Redis at start-up: {exc}"
                                     ) from None
                time.sleep(0.5)
    finally:
        client.close()


CLAIM = """
local held = redis.call('HGET', KEYS[1], 'address')
if held and held ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'address', ARGV[1], 'state', 'starting', 'capacity', 0,
           'workers', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""


def _claim(client: redis.Redis, settings: ClusterSettings) -> str:
    for tag in _order(settings.node_address):
        key = f"{settings.prefix}node:{tag}"
        if client.eval(CLAIM, 1, key, settings.node_address, int(STARTING_TTL_S * 1000)):
            os.environ[TAG_ENV] = tag  # the workers' (they start from this environment)
            return tag
    raise ClaimError("cluster_full", f"every one of the {len(TAGS)} node tags is taken")
