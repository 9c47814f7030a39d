"""Which transport a URL implies, URLs refused before dialling, and a SIP address where nothing
listens: `python -m agent.peer sip:agent@HOST:PORT` dials SIP without `--transport sip`, a URL
the transport cannot dial is one `error [bad_url]` line with exit status 2, and a SIP server
that is not there (an agent without `--sip-listen`) is named at once, not after the timeout."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.testing.peer.call import place_call
from agent.testing.peer.transports.base import PeerOptions
from agent.testing.peer.transports.urls import transport_of, url_problem

HINT = "is the server running with --sip-listen?"


def closed_udp_port() -> int:
    """A loopback UDP port nothing listens on (the kernel answers ICMP port unreachable)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def run_peer(*argv: str, timeout: float = 90) -> tuple[int, str, str]:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(peer.communicate(), timeout)
    assert peer.returncode is not None
    return peer.returncode, out.decode(), err.decode()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("url,transport", [
    ("sip:agent@127.0.0.1:5060", "sip"),
    ("SIP:agent@example.com", "sip"),
    ("sips:agent@example.com:5061", "sip"),
    ("ws://127.0.0.1:8080/v1/telephony/media-stream", "media-stream"),
    ("wss://agent.example.com", "media-stream"),
    ("rtp://127.0.0.1:4000", "rtp"),
    ("http://127.0.0.1:8080", None),
    ("https://agent.example.com", None),
    ("127.0.0.1:8080", None),
])
def test_the_transport_a_url_implies(url: str, transport: str | None) -> None:
    assert transport_of(url) == transport


def test_url_problems_name_the_transport_a_url_is_for() -> None:
    assert url_problem("sip:agent@127.0.0.1:5060", "sip") is None
    assert url_problem("http://127.0.0.1:8080", "webrtc") is None
    problem = url_problem("sip:agent@127.0.0.1:5060", "webrtc")
    assert problem is not None and "--transport sip" in problem
    assert "sip:USER@HOST" in (url_problem("http://127.0.0.1:8080", "sip") or "")
    assert "UDP only" in (url_problem("sips:agent@127.0.0.1:5061", "sip") or "")
    assert "needs a port" in (url_problem("rtp://127.0.0.1", "rtp") or "")


async def test_a_sip_url_dials_sip_and_a_missing_server_is_named_with_a_hint(
        tmp_path: Path) -> None:
    port = closed_udp_port()
    status, out, err = await run_peer(f"sip:agent@127.0.0.1:{port}", "--timeout", "60",
                                      "--json", str(tmp_path / "r.json"))
    assert status == 1, err
    line = one_line(err)
    assert line.startswith("error [connect_failed]: nothing answered SIP at "
                           f"127.0.0.1:{port}"), line
    assert HINT in line and "port unreachable" in line
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["transport"] == "sip" and report["connected"] is False


@pytest.mark.parametrize("argv,says", [
    (["http://127.0.0.1:9", "--transport", "sip"], "the sip transport dials sip:USER@HOST"),
    (["sip:agent@127.0.0.1:9", "--transport", "webrtc"], "--transport sip"),
    (["sips:agent@127.0.0.1:9"], "UDP only"),
    (["rtp://127.0.0.1", "--transport", "rtp"], "rtp:// needs a port"),
    (["ftp://127.0.0.1:9"], "the webrtc transport needs an http:// or https:// URL"),
])
async def test_a_url_the_transport_cannot_dial_is_refused_before_dialling(
        argv: list[str], says: str) -> None:
    status, out, err = await run_peer(*argv)
    assert status == 2 and out == "", err
    line = one_line(err)
    assert line.startswith("error [bad_url]: ") and says in line, line


async def test_a_sip_call_to_a_closed_port_fails_at_once_not_at_the_timeout() -> None:
    port = closed_udp_port()
    started = time.monotonic()
    report, _ = await place_call(f"sip:agent@127.0.0.1:{port}", "sip",
                                 PeerOptions(timeout=30.0), seconds=1.0)
    assert report.error_code == "connect_failed", report
    assert f"nothing answered SIP at 127.0.0.1:{port}" in (report.error or "")
    assert HINT in (report.error or "")
    assert time.monotonic() - started < 15  # ICMP, not the 30 s timeout


@pytest.fixture
async def silent_udp_port() -> AsyncIterator[int]:
    """A UDP port that takes datagrams and never answers (a firewall that drops them)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        yield int(sink.getsockname()[1])


async def test_a_sip_server_that_sends_nothing_is_named_when_the_timeout_ends(
        silent_udp_port: int) -> None:
    report, _ = await place_call(f"sip:agent@127.0.0.1:{silent_udp_port}", "sip",
                                 PeerOptions(timeout=1.5), seconds=1.0)
    assert report.error_code == "timeout", report
    assert "INVITE" in (report.error or "") and HINT in (report.error or "")
    assert f"nothing answered SIP at 127.0.0.1:{silent_udp_port}" in (report.error or "")


async def test_a_sip_server_that_sends_nothing_is_given_up_on_before_a_long_timeout(
        silent_udp_port: int) -> None:
    started = time.monotonic()
    report, _ = await place_call(f"sip:agent@127.0.0.1:{silent_udp_port}", "sip",
                                 PeerOptions(timeout=60.0), seconds=1.0)
    assert report.error_code == "timeout", report
    assert "within 5 s" in (report.error or "") and HINT in (report.error or ""), report
    assert time.monotonic() - started < 30  # not the 60 s the peer would wait for an answer
