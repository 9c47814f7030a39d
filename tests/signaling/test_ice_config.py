"""ICE server flags and their RFC 9725 Link headers."""

from __future__ import annotations

import pytest
from aiortc import RTCIceServer

from signaling.__main__ import build_parser, settings_from_args
from signaling.ice import link_headers


def test_ice_server_flags_build_the_agent_list() -> None:
    args = build_parser().parse_args([
        "--ice-server", "stun:stun.example.com:3478",
        "--ice-server", "turn:turn.example.com?transport=tcp",
        "--ice-username", "alice", "--ice-credential", "s3cret",
    ])
    servers = settings_from_args(args).ice_servers
    assert [(s.urls, s.username, s.credential) for s in servers] == [
        ("stun:stun.example.com:3478", None, None),
        ("turn:turn.example.com?transport=tcp", "alice", "s3cret"),
    ]


def test_no_ice_server_by_default() -> None:
    assert settings_from_args(build_parser().parse_args([])).ice_servers == []


@pytest.mark.parametrize("argv", [
    ["--ice-username", "u"],  # no server to apply it to
    ["--ice-server", "http://example.com"],
    ["--ice-server", "stun:host?transport=udp"],  # aiortc refuses transport on STUN
    ["--ice-server", "turn:h", "--ice-username", "a", "--ice-username", "b"],
])
def test_bad_ice_flags_are_refused_at_startup(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


def test_turn_without_credentials_is_refused() -> None:
    args = build_parser().parse_args(["--ice-server", "turn:turn.example.com"])
    with pytest.raises(SystemExit):
        settings_from_args(args)


def test_link_headers_quote_credentials() -> None:
    links = link_headers([
        RTCIceServer(urls="stun:s.example"),
        RTCIceServer(urls=["turn:t.example?transport=udp", "turns:t.example"],
                     username='a"b', credential="p"),
    ])
    assert links == [
        '<stun:s.example>; rel="ice-server"',
        '<turn:t.example?transport=udp>; rel="ice-server"; username="a\\"b"; '
        'credential="p"; credential-type="password"',
        '<turns:t.example>; rel="ice-server"; username="a\\"b"; credential="p"; '
        'credential-type="password"',
    ]
