"""SIP over TLS (RFC 3261 §26.3.1, RFC 5630): `--sip-tls-cert/--sip-tls-key` serve it.

TLS is a third listener beside UDP and TCP, by default on the `--sip-listen` port + 1 (5061
beside 5060), or where `--sip-tls-listen` says. Messages over it are framed like TCP's; a
dialog that began over TLS sends its in-dialog requests back on the same connection, and its
Contact says `;transport=tls`. Requests the agent opens over TLS (to a trunk or a Contact
with `transport=tls`) verify the far end's certificate against the system's CAs, or
`--sip-tls-ca`. The standard library's `ssl` does the TLS: nothing here but settings.
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SipTlsSettings:
    cert: str
    key: str
    host: str
    port: int  # 0: any free port (tests)
    ca_file: str | None = None


def add_arguments(group: argparse._ActionsContainer,
                  parse_listen: Callable[[str], tuple[str, int]]) -> None:
    group.add_argument("--sip-tls-cert", default=None, metavar="FILE",
                       help="PEM certificate chain: also serve SIP over TLS (default: off)")
    group.add_argument("--sip-tls-key", default=None, metavar="FILE",
                       help="PEM private key for --sip-tls-cert")
    group.add_argument("--sip-tls-listen", type=parse_listen, default=None,
                       metavar="HOST:PORT",
                       help="where SIP over TLS listens (default: the --sip-listen host, "
                       "its port + 1, e.g. 5061)")
    group.add_argument("--sip-tls-ca", default=None, metavar="FILE",
                       help="CA bundle verifying the far end when the agent opens a TLS "
                       "connection (default: the system's)")


def settings_from_args(args: argparse.Namespace, listen_host: str,
                       listen_port: int) -> SipTlsSettings | None:
    """The TLS settings, None without `--sip-tls-cert`; ValueError for an inconsistent set."""
    cert = getattr(args, "sip_tls_cert", None)
    key = getattr(args, "sip_tls_key", None)
    if cert is None and key is None:
        if getattr(args, "sip_tls_listen", None) is not None:
            raise ValueError("--sip-tls-listen needs --sip-tls-cert and --sip-tls-key")
        return None
    if cert is None or key is None:
        raise ValueError("--sip-tls-cert and --sip-tls-key go together")
    listen = getattr(args, "sip_tls_listen", None)
    if listen is not None:
        host, port = listen
    else:
        host, port = listen_host, (listen_port + 1 if listen_port else 0)
    settings = SipTlsSettings(cert=cert, key=key, host=host, port=port,
                              ca_file=getattr(args, "sip_tls_ca", None))
    server_context(settings)  # a bad file is a start-up error, not a failed first call
    client_context(settings)
    return settings


def server_context(settings: SipTlsSettings) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(settings.cert, settings.key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--sip-tls-cert/--sip-tls-key: cannot load "
                         f"{settings.cert} / {settings.key}: {exc}") from None
    return context


def client_context(settings: SipTlsSettings | None) -> ssl.SSLContext:
    ca_file = settings.ca_file if settings is not None else None
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--sip-tls-ca: cannot load {ca_file}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context
