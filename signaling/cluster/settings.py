"""Cluster mode's flags (`--cluster`, `--node-address`, `--cluster-secret`, `--cluster-ca`,
`--max-calls-per-key`) and what they are parsed into.

Without `--cluster` nothing of the cluster starts and Redis is never imported: this module
and the package's `__init__` import no Redis client.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass, field

from yarl import URL

from agent.errors import AgentError

SECRET_ENV = "AGENT_CLUSTER_SECRET"
HEARTBEAT_S = 2.0  # a node rewrites its record this often ...
TTL_S = 6.0  # ... and the record (with its calls) is gone this long after the last one
MIN_SECRET_BYTES = 16


class ClusterFlagError(AgentError, ValueError):
    """A cluster flag that cannot work: `code` names it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)


@dataclass(frozen=True)
class ClusterSettings:
    redis_url: str
    node_address: str  # where the other nodes reach this one: http(s)://HOST:PORT
    secret: bytes = field(repr=False)
    max_calls_per_key: int = 0  # 0: no per-key limit
    heartbeat_s: float = HEARTBEAT_S
    ttl_s: float = TTL_S
    ice_hosts: tuple[str, ...] = ()  # --ice-host: where ICE host candidates are gathered
    cluster_ca: str | None = None  # --cluster-ca: the CAs https node addresses are checked by

    def node_tls(self) -> ssl.SSLContext:
        """How this node checks another's https address: against --cluster-ca alone where
        given, else the system's CAs (hostnames checked either way)."""
        return ssl.create_default_context(cafile=self.cluster_ca)

    @property
    def prefix(self) -> str:
        """Every key this cluster writes starts with it (several clusters may share a DB)."""
        return "agent:"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster (several hosts behind one address)")
    group.add_argument(
        "--cluster", default=None, metavar="redis://HOST:PORT/DB",
        help="join the cluster kept in this Redis: ids name their node, a request for another "
        "node's call is forwarded to it, admission and ephemeral secrets are cluster-wide "
        "(docs/operations.md, Cluster; default: off, no Redis needed)")
    group.add_argument(
        "--node-address", default=None, metavar="URL",
        help="where the other nodes reach this one, e.g. http://10.0.0.5:8080 (may be this "
        "server's own listener; needed with --cluster). Forwarded requests carry clients' "
        "Authorization and bodies: use https:// (this server with --tls-cert) unless the "
        "network between the nodes is private to them (docs/security.md)")
    group.add_argument(
        "--cluster-secret", default=None, metavar="SECRET",
        help=f"the secret the nodes sign forwarded requests with (default: env {SECRET_ENV}; "
        "prefer the environment: a command line is visible to every local user)")
    group.add_argument(
        "--cluster-ca", default=None, metavar="FILE",
        help="PEM bundle of the CAs that signed the nodes' https certificates: requests to "
        "an https:// node address are verified against these alone (default: the system's "
        "CAs)")
    group.add_argument(
        "--max-calls-per-key", type=int, default=0, metavar="N",
        help="concurrent calls one API key (without keys: all clients) may hold, every kind "
        "counted (WebRTC, RTP, media streams, outbound SIP from its INVITE on): across the "
        "cluster with --cluster, else on this server; a new call beyond it gets 429 "
        "tenant_limit (media streams are counted, not refused; default 0 = no limit)")


def settings_from_args(args: argparse.Namespace) -> ClusterSettings | None:
    """The cluster's settings, None without `--cluster`; ClusterFlagError when they cannot
    work."""
    cluster_ca = getattr(args, "cluster_ca", None)
    if not args.cluster:
        # (--max-calls-per-key counts this server's calls then: signaling/call_limit.py)
        if args.max_calls_per_key < 0:
            raise ClusterFlagError("max_calls_per_key_invalid",
                                   "--max-calls-per-key must be >= 0")
        if cluster_ca:
            raise ClusterFlagError("cluster_flag_without_cluster",
                                   "--cluster-ca checks other nodes' certificates: it needs "
                                   "--cluster")
        return None
    url = URL(args.cluster)
    if url.scheme not in ("redis", "rediss", "unix") or (url.scheme != "unix" and not url.host):
        raise ClusterFlagError("cluster_url_invalid",
                               f"--cluster must be redis://HOST:PORT/DB, not {args.cluster!r}")
    if not args.node_address:
        raise ClusterFlagError("node_address_missing",
                               "--cluster needs --node-address URL (where other nodes reach "
                               "this one)")
    address = URL(args.node_address)
    if address.scheme not in ("http", "https") or not address.host or address.path not in (
            "", "/"):
        raise ClusterFlagError("node_address_invalid", "--node-address must be "
                               f"http(s)://HOST:PORT, not {args.node_address!r}")
    secret = args.cluster_secret or os.environ.get(SECRET_ENV, "")
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ClusterFlagError("cluster_secret_missing",
                               f"--cluster needs a shared secret of at least {MIN_SECRET_BYTES} "
                               f"bytes (env {SECRET_ENV} or --cluster-secret)")
    if args.max_calls_per_key < 0:
        raise ClusterFlagError("max_calls_per_key_invalid", "--max-calls-per-key must be >= 0")
    settings = ClusterSettings(args.cluster, str(address).rstrip("/"), secret.encode(),
                               args.max_calls_per_key,
                               ice_hosts=tuple(getattr(args, "ice_host", None) or ()),
                               cluster_ca=cluster_ca or None)
    if settings.cluster_ca:
        try:
            settings.node_tls()
        except (OSError, ssl.SSLError) as exc:
            raise ClusterFlagError("cluster_ca_invalid", f"--cluster-ca {cluster_ca!r}: no "
                                   f"PEM certificates could be read ({exc})") from None
    return settings
