"""ICE servers: the `--ice-server` flags, `Link` headers (RFC 9725) and `GET /v1/realtime/config`;
the agent's own ICE ports and advertised addresses (`--rtc-ports`, `--rtc-udp-port`,
`--rtc-advertise`).

The one signaling module that imports agent.rtc_tuning (aiortc's settings from outside):
what the command line needs of it, signaling/__main__.py takes from here.

The same list configures the agent's own peer connections (so it gathers srflx/relay
candidates) and is advertised to callers; aiortc itself uses the first STUN and the first
TURN URL of the list. The default is no ICE server at all: host
candidates only, because a STUN lookup on a closed network stalls every answer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from aiohttp import web
from aiortc import RTCIceServer
from aiortc.rtcicetransport import parse_stun_turn_uri

from agent.media_agent import AgentSettings
from agent.rtc_tuning import AUDIO_CODECS as AUDIO_CODECS
from agent.rtc_tuning import limit_host_addresses as limit_host_addresses
from agent.rtc_tuning import parse_codec_list as parse_codec_list
from agent.rtc_tuning.advertise import parse_advertised
from agent.rtc_tuning.port_range import PortRange as PortRange
from agent.rtc_tuning.port_range import host_address_count as host_address_count
from agent.rtc_tuning.port_range import limit_host_ports as limit_host_ports
from agent.rtc_tuning.port_range import parse_port_range
from agent.rtc_tuning.port_range import ports_needed as ports_needed
from agent.rtc_tuning.udp_mux import UdpMux as UdpMux
from agent.rtc_tuning.udp_mux import parse_udp_port
from agent.rtc_tuning.udp_mux import use_udp_mux as use_udp_mux
from signaling.keys import AGENT_KEY

ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")


def url_problem(url: str) -> str | None:
    """Why aiortc would refuse this STUN/TURN URL (it would fail every call), or None."""
    if not url.startswith(ICE_SCHEMES):
        return f"must start with one of {', '.join(ICE_SCHEMES)}"
    try:
        parse_stun_turn_uri(url)
    except ValueError as exc:
        return str(exc)
    return None


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def server_urls(server: RTCIceServer) -> list[str]:
    return [server.urls] if isinstance(server.urls, str) else list(server.urls)


def link_headers(servers: Sequence[RTCIceServer]) -> list[str]:
    """One `Link: <url>; rel="ice-server"...` value per URL (RFC 9725 section 4.6)."""
    links = []
    for server in servers:
        for url in server_urls(server):
            link = f'<{url}>; rel="ice-server"'
            if server.username is not None:
                link += f"; username={_quote(server.username)}"
            if server.credential is not None:
                link += f"; credential={_quote(server.credential)}"
                link += f'; credential-type="{server.credentialType or "password"}"'
            links.append(link)
    return links


def browser_ice_servers(servers: Sequence[RTCIceServer]) -> list[dict[str, Any]]:
    """The list as a browser's `RTCPeerConnection({iceServers})` takes it."""
    result = []
    for server in servers:
        entry: dict[str, Any] = {"urls": server_urls(server)}
        if server.username is not None:
            entry["username"] = server.username
        if server.credential is not None:
            entry["credential"] = server.credential
        result.append(entry)
    return result


def rtc_network(settings: AgentSettings) -> dict[str, Any]:
    """The agent's host candidates as callers see them: the UDP port range they are bound in
    (None: any port), the one port every call shares (None: no mux) and the addresses
    advertised in their place (empty: the bound ones)."""
    ports = settings.rtc_ports
    return {"ports": None if ports is None else str(ports),
            "udp_port": settings.rtc_udp_port,
            "advertise": list(settings.rtc_advertise)}


async def get_config(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    capabilities = agent.plugin.capabilities()
    return web.json_response({
        "ice_servers": browser_ice_servers(agent.settings.ice_servers),
        "rtc": rtc_network(agent.settings),
        "calls_url": "/v1/realtime/calls",
        "data_channel": "oai-events",
        "plugin": agent.plugin.id,
        "codecs": list(agent.settings.codecs),
        "sample_rate": capabilities.sample_rate,
        "voices": list(capabilities.voices),
        "default_voice": capabilities.default_voice,
    })


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/realtime/config", get_config)


# -- command line -----------------------------------------------------------------------------


class _IceServerAction(argparse.Action):
    """`--ice-server URL`: start a new server entry."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        url = str(values)
        problem = url_problem(url)
        if problem:
            parser.error(f"--ice-server {url!r}: {problem}")
        entries = list(getattr(namespace, self.dest) or [])
        entries.append({"urls": url, "username": None, "credential": None})
        setattr(namespace, self.dest, entries)


class _IceCredentialAction(argparse.Action):
    """`--ice-username U` / `--ice-credential C`: applies to the preceding `--ice-server`."""

    def __init__(self, *args: Any, field_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.field_name = field_name

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        entries = getattr(namespace, "ice_servers", None) or []
        if not entries:
            parser.error(f"{option_string} must follow an --ice-server")
        if entries[-1][self.field_name] is not None:
            parser.error(f"{option_string} given twice for {entries[-1]['urls']}")
        entries[-1][self.field_name] = str(values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ICE servers")
    group.add_argument(
        "--ice-server", dest="ice_servers", action=_IceServerAction, default=[], metavar="URL",
        help="STUN/TURN server for the agent's peer connections, also advertised to callers "
        "(repeatable; e.g. turn:turn.example.com:3478?transport=udp; default: none)",
    )
    group.add_argument("--ice-username", action=_IceCredentialAction, field_name="username",
                       metavar="U", help="TURN username for the preceding --ice-server")
    group.add_argument("--ice-credential", action=_IceCredentialAction,
                       field_name="credential", metavar="C",
                       help="TURN password for the preceding --ice-server")
    group.add_argument(
        "--rtc-ports", default=None, metavar="LOW-HIGH",
        help="bind the agent's ICE host candidates only to UDP ports in this range, to open "
        "in a firewall or security group; it needs one port per host address (--ice-host) "
        "per call, so at least --max-sessions x addresses (a start-up error otherwise); a "
        "call finding every port taken is refused 503 rtc_ports_exhausted "
        "(default: any port)")
    group.add_argument(
        "--rtc-udp-port", default=None, metavar="PORT",
        help="every call's ICE, DTLS and SRTP on this one UDP port (one socket per host "
        "address, calls told apart by their ICE username, then by the checked remote "
        "address): one port to open or publish; with --rtc-advertise the advertised port is "
        "this one; one worker only (default: a socket per call)")
    group.add_argument(
        "--rtc-advertise", action="append", default=[], metavar="ADDR",
        help="1:1 NAT: put this public address in the answer's host candidates and c= lines "
        "in place of the bound private one (repeatable, one IPv4 and one IPv6; every host "
        "candidate of that family is advertised so: pick the private one with --ice-host; "
        "default: the bound addresses)")


def rtc_ports_from_args(args: argparse.Namespace) -> PortRange | None:
    """`--rtc-ports` checked (ValueError says what is wrong)."""
    text = getattr(args, "rtc_ports", None)
    return None if text is None else parse_port_range(text)


def rtc_udp_port_from_args(args: argparse.Namespace) -> int | None:
    """`--rtc-udp-port` checked (ValueError says what is wrong)."""
    text = getattr(args, "rtc_udp_port", None)
    if text is None:
        return None
    if getattr(args, "rtc_ports", None) is not None:
        raise ValueError("and --rtc-ports exclude each other: every call is on the one port")
    return parse_udp_port(text)


def rtc_advertise_from_args(args: argparse.Namespace) -> tuple[str, ...]:
    """`--rtc-advertise` checked (ValueError says what is wrong)."""
    return parse_advertised(getattr(args, "rtc_advertise", None) or [])


def ice_servers_from_args(args: argparse.Namespace) -> list[RTCIceServer]:
    servers = []
    for entry in getattr(args, "ice_servers", None) or []:
        url = entry["urls"]
        if url.startswith(("turn:", "turns:")) and (
            entry["username"] is None or entry["credential"] is None
        ):
            raise SystemExit(f"--ice-server {url}: TURN needs --ice-username and --ice-credential")
        for value in (entry["username"], entry["credential"]):
            if value is not None and any(ord(ch) < 32 or ch == "\x7f" for ch in value):
                raise SystemExit(f"--ice-server {url}: control characters in a credential")
        servers.append(RTCIceServer(urls=url, username=entry["username"],
                                    credential=entry["credential"]))
    return servers
