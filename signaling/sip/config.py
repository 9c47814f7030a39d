"""The SIP user agent's settings and command-line flags (`--sip-listen` turns it on)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from agent.telephony.address_policy import DEFAULT_RTP_ALLOW, IPNetwork, parse_networks
from signaling.auth import API_KEY_ENV, tenant_of
from signaling.call_webhook import WEBHOOK_SECRET_ENV, check_webhook_secret
from signaling.rtp_body import split_ip_port
from signaling.sip import budget as sip_budget
from signaling.sip import guard as sip_guard
from signaling.sip import media as sip_media
from signaling.sip import outbound_policy
from signaling.sip import sdes as sip_sdes
from signaling.sip import tls as sip_tls
from signaling.sip.caller_auth import CallerAuthSettings, load_auth_file
from signaling.sip.flag_types import seconds_between as seconds_between
from signaling.sip.message import MAX_MESSAGE_BYTES
from signaling.sip.timers import TimerSettings
from signaling.sip.trunks import Trunk, load_trunks
from signaling.telephony import network_argument

WILDCARDS = ("0.0.0.0", "::")
DEFAULT_ACCEPT_TIMEOUT = 10.0
DEFAULT_RING_TIMEOUT = 60.0  # an outbound call not answered by then ends no_answer


@dataclass(frozen=True)
class SipConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 5060  # 0: any free port (tests)
    advertise: str | None = None  # the host put in Via and Contact (and SDP if RTP binds *)
    allowed_networks: tuple[IPNetwork, ...] = field(
        default_factory=lambda: parse_networks(DEFAULT_RTP_ALLOW))
    ring_seconds: float = 0.0  # between 180 Ringing and the 200 OK
    timers: TimerSettings = field(default_factory=TimerSettings)
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # With a webhook, an INVITE waits (ringing) for POST .../accept or .../reject.
    webhook_url: str | None = None
    webhook_secret: str | None = field(default=None, repr=False)  # whsec_...
    accept_timeout: float = DEFAULT_ACCEPT_TIMEOUT  # no answer by then: 480
    # Outbound calls (POST /v1/sip/calls): named trunks, and how long one may ring.
    trunks: Mapping[str, Trunk] = field(default_factory=dict)
    ring_timeout: float = DEFAULT_RING_TIMEOUT
    guard: sip_guard.GuardSettings = field(default_factory=sip_guard.GuardSettings)  # guard.py
    budget: sip_budget.BudgetSettings = field(  # every message, transactions, TCP (budget.py)
        default_factory=sip_budget.BudgetSettings)
    tls: sip_tls.SipTlsSettings | None = None  # --sip-tls-cert: also SIP over TLS (tls.py)
    srtp: str = sip_sdes.DEFAULT_MODE  # --sip-srtp off|offer|require (sdes.py)
    caller_auth: CallerAuthSettings | None = None  # --sip-auth-file (caller_auth.py)
    media_timeout: float = sip_media.DEFAULT_MEDIA_TIMEOUT  # --sip-media-timeout (media.py)
    # outbound_policy.py: calls one key may place a second (0: no limit), at once
    outbound_rate: float = outbound_policy.DEFAULT_RATE
    outbound_burst: int = outbound_policy.DEFAULT_BURST
    # --sip-inbound-key: the tenant owning webhook calls (None: any key of the server)
    inbound_tenant: str | None = field(default=None, repr=False)

    @property
    def advertised_host(self) -> str:
        return self.advertise or self.listen_host


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` with an IP literal host."""
    try:
        ip, port, sep = split_ip_port(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with an IP address, e.g. 127.0.0.1:5060, not {text!r}") from None
    if not sep or not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port in {text!r}")
    return ip, port


def _webhook_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL, not {text!r}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SIP (docs/sip.md)")
    group.add_argument("--sip-listen", type=parse_listen, default=None, metavar="HOST:PORT",
                       help="answer SIP calls over UDP and TCP on HOST:PORT, e.g. "
                       "127.0.0.1:5060 (default: off); media goes over RTP legs (--rtp-*)")
    group.add_argument("--sip-advertise", default=None, metavar="HOST",
                       help="address put in Via and Contact, and in the SDP when --rtp-bind "
                       "is a wildcard without --rtp-advertise (default: the --sip-listen "
                       "host; required when that is 0.0.0.0 or ::)")
    group.add_argument("--sip-allow", action="append", type=network_argument, default=None,
                       metavar="CIDR",
                       help="network allowed to send SIP requests; others get 403 (repeatable; "
                       f"default {' '.join(DEFAULT_RTP_ALLOW)})")
    group.add_argument("--sip-ring-seconds", type=seconds_between(0, 60), default=0.0, metavar="S",
                       help="ring S seconds (180 Ringing) before answering (default 0)")
    group.add_argument("--sip-webhook", type=_webhook_url, default=None, metavar="URL",
                       help="POST realtime.call.incoming here for each INVITE and wait for "
                       "POST /v1/realtime/calls/{call_id}/accept or /reject (default: "
                       "calls are accepted at once)")
    group.add_argument("--webhook-secret", default=None, metavar="WHSEC",
                       help="Standard Webhooks secret (whsec_...) signing the webhooks "
                       f"(default: ${WEBHOOK_SECRET_ENV}; prefer the environment)")
    group.add_argument("--sip-accept-timeout", type=seconds_between(0.1, 300),
                       default=DEFAULT_ACCEPT_TIMEOUT, metavar="S",
                       help="with --sip-webhook, answer 480 when no accept or reject came "
                       f"within S seconds (default {DEFAULT_ACCEPT_TIMEOUT:g})")
    sip_guard.add_arguments(group)  # --sip-invite-rate/-burst/-table
    sip_budget.add_arguments(group)  # --sip-message-rate/-burst, --sip-max-transactions, TCP
    sip_tls.add_arguments(group, parse_listen)  # --sip-tls-cert/-key/-listen/-ca
    sip_sdes.add_arguments(group)  # --sip-srtp
    sip_media.add_arguments(group)  # --sip-media-timeout
    outbound_policy.add_arguments(group)  # --sip-outbound-rate/-burst, --sip-inbound-key
    group.add_argument("--sip-auth-file", default=None, metavar="FILE",
                       help='JSON {"realm": "...", "users": {"alice": "password" | {"ha1": '
                       '"..."}}}: challenge INVITEs and other out-of-dialog requests with '
                       "digest (401), 403 for wrong credentials (default: no challenge)")
    group.add_argument("--sip-trunks", default=None, metavar="FILE",
                       help="JSON object of named trunks for POST /v1/sip/calls, e.g. "
                       '{"t1": {"proxy": "sip:HOST:PORT", "username": "...", "password": '
                       '"..."}} (credentials stay in the file; docs/sip.md#trunks)')
    group.add_argument("--sip-ring-timeout", type=seconds_between(1, 600),
                       default=DEFAULT_RING_TIMEOUT, metavar="S",
                       help="an outbound call not answered within S seconds is cancelled "
                       f"and ends no_answer (default {DEFAULT_RING_TIMEOUT:g})")


def config_from_args(args: argparse.Namespace) -> SipConfig | None:
    """The SIP settings, or None without --sip-listen. ValueError: an inconsistent set."""
    trunks_file = getattr(args, "sip_trunks", None)
    if args.sip_listen is None:
        if trunks_file:
            raise ValueError("--sip-trunks needs --sip-listen: outbound calls leave from the "
                             "SIP user agent's address")
        return None
    host, port = args.sip_listen
    if host in WILDCARDS and not args.sip_advertise:
        raise ValueError(f"--sip-listen {host} needs --sip-advertise: the address callers "
                         "reach this host at, put in Via and Contact")
    secret = args.webhook_secret or os.environ.get(WEBHOOK_SECRET_ENV) or None
    if args.sip_webhook and secret is None:
        raise ValueError(f"--sip-webhook needs a signing secret: set {WEBHOOK_SECRET_ENV} "
                         "(or --webhook-secret) to a whsec_... secret")
    if secret is not None:
        check_webhook_secret(secret)
    return SipConfig(
        listen_host=host, listen_port=port, advertise=args.sip_advertise,
        allowed_networks=parse_networks(args.sip_allow or DEFAULT_RTP_ALLOW),
        ring_seconds=args.sip_ring_seconds, webhook_url=args.sip_webhook,
        webhook_secret=secret, accept_timeout=args.sip_accept_timeout,
        guard=sip_guard.settings_from_args(args),
        budget=sip_budget.settings_from_args(args),
        tls=sip_tls.settings_from_args(args, host, port),
        trunks=load_trunks(trunks_file) if trunks_file else {},
        ring_timeout=getattr(args, "sip_ring_timeout", DEFAULT_RING_TIMEOUT),
        srtp=getattr(args, "sip_srtp", sip_sdes.DEFAULT_MODE),
        media_timeout=getattr(args, "sip_media_timeout", sip_media.DEFAULT_MEDIA_TIMEOUT),
        caller_auth=(load_auth_file(args.sip_auth_file)
                     if getattr(args, "sip_auth_file", None) else None),
        outbound_rate=getattr(args, "sip_outbound_rate", outbound_policy.DEFAULT_RATE),
        outbound_burst=max(1, getattr(args, "sip_outbound_burst",
                                      outbound_policy.DEFAULT_BURST)),
        inbound_tenant=inbound_tenant(args),
    )


def inbound_tenant(args: argparse.Namespace) -> str | None:
    """The tenant of `--sip-inbound-key`, which must be one of the server's keys."""
    key = getattr(args, "sip_inbound_key", None)
    if not key:
        return None
    keys = [*(getattr(args, "api_key", None) or []), *(getattr(args, "admin_key", None) or []),
            os.environ.get(API_KEY_ENV, "")]
    if key not in keys:
        raise ValueError("--sip-inbound-key must be one of the server's keys (--api-key, "
                         "--admin-key): the calls it owns are managed with it")
    return tenant_of(key)
