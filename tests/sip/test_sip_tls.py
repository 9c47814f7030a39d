"""SIP over TLS (signaling/sip/tls.py): a call over a verified TLS connection, the agent's
BYE back on it, a plain-TCP client on the TLS port, and start-up errors for bad files."""

from __future__ import annotations

import argparse
import asyncio
import ssl
from pathlib import Path

import aiohttp
import pytest

from signaling.sip.config import SipConfig, parse_listen
from signaling.sip.message import SipRequest, SipResponse
from signaling.sip.tls import SipTlsSettings, add_arguments, settings_from_args
from tests.sip.helpers import (
    HOST,
    Dialogue,
    RtpProbe,
    SipServer,
    SipServerFactory,
    TcpSipPeer,
    sdp_offer,
)
from tests.sip.test_sip_ua import reply_to
from tests.support.agents import wait_until
from tests.support.tls import self_signed


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (an IP SAN, which TLS clients verify)."""
    return self_signed(tmp_path)


async def tls_peer(server: SipServer, cert: Path) -> TcpSipPeer:
    context = ssl.create_default_context(cafile=str(cert))  # verifies 127.0.0.1 against SAN
    reader, writer = await asyncio.open_connection(HOST, server.ua.port_for("TLS"),
                                                   ssl=context, server_hostname=HOST)
    return TcpSipPeer(reader, writer)


async def test_a_call_over_tls_and_the_agents_bye_on_the_same_connection(
    start_sip: SipServerFactory, certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    server = await start_sip(config=SipConfig(
        listen_port=0, tls=SipTlsSettings(str(cert), str(key), HOST, 0)), drain_seconds=0.3)
    assert server.ua.port_for("TLS") not in (0, server.ua.port)
    probe = await RtpProbe.open()
    connection = await tls_peer(server, cert)
    dialogue = Dialogue(connection.port, (HOST, server.ua.port_for("TLS")), transport="TLS")
    invite = dialogue.request("INVITE", body=sdp_offer(probe.port))
    connection.send(invite)
    statuses, message = await connection.until_final()
    assert statuses == [100, 180, 200]
    contact = message.headers.get("contact") or ""
    assert contact.endswith(f":{server.ua.port_for('TLS')};transport=tls>"), contact
    connection.send(dialogue.ack_for(invite, message))
    await wait_until(lambda: server.sip_legs() == 1)
    assert server.ua.stats()["transport"]["tls_connections"] == 1  # type: ignore[index]
    # The agent ends the call (a drain): its BYE comes back over the same TLS connection.
    async with aiohttp.ClientSession() as http, http.post(server.url + "/admin/drain") as reply:
        assert reply.status == 202
    bye = await connection.next(timeout=5)
    assert isinstance(bye, SipRequest) and bye.method == "BYE", bye
    via = bye.headers.get("via") or ""
    assert via.startswith(f"SIP/2.0/TLS {HOST}:{server.ua.port_for('TLS')};"), via
    connection.send(reply_to(bye, 200))
    await wait_until(server.quiet)
    await connection.close()
    probe.close()


async def test_plain_tcp_on_the_tls_port_is_closed_and_tls_goes_on(
    start_sip: SipServerFactory, certificate: tuple[Path, Path],
) -> None:
    cert, key = certificate
    server = await start_sip(config=SipConfig(
        listen_port=0, tls=SipTlsSettings(str(cert), str(key), HOST, 0)))
    plain = await TcpSipPeer.connect((HOST, server.ua.port_for("TLS")))
    dialogue = Dialogue(plain.port, (HOST, server.ua.port_for("TLS")), transport="TCP")
    plain.send(dialogue.request("OPTIONS"))
    assert await plain.next(timeout=5) is None  # the handshake failed: closed, no answer
    await plain.close()
    secure = await tls_peer(server, cert)
    dialogue = Dialogue(secure.port, (HOST, server.ua.port_for("TLS")), transport="TLS")
    secure.send(dialogue.request("OPTIONS"))
    answer = await secure.next()
    assert isinstance(answer, SipResponse) and answer.status == 200
    await secure.close()


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, parse_listen)
    return parser.parse_args(list(argv))


def test_tls_settings_and_their_errors(certificate: tuple[Path, Path], tmp_path: Path) -> None:
    cert, key = certificate
    settings = settings_from_args(_args("--sip-tls-cert", str(cert), "--sip-tls-key", str(key)),
                                  "127.0.0.1", 5060)
    assert settings is not None and (settings.host, settings.port) == ("127.0.0.1", 5061)
    assert settings_from_args(_args(), "127.0.0.1", 5060) is None
    with pytest.raises(ValueError, match="go together"):
        settings_from_args(_args("--sip-tls-cert", str(cert)), "127.0.0.1", 5060)
    with pytest.raises(ValueError, match="needs --sip-tls-cert"):
        settings_from_args(_args("--sip-tls-listen", "127.0.0.1:5061"), "127.0.0.1", 5060)
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(ValueError, match="cannot load"):
        settings_from_args(_args("--sip-tls-cert", str(bogus), "--sip-tls-key", str(key)),
                           "127.0.0.1", 5060)
