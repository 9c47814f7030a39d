"""`--tls-cert/--tls-key`: the server speaks https (pages off localhost need it for the mic)."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support.server_process import free_tcp_port, running_server, start_peer
from tests.support.tls import self_signed


async def run_peer(url: str, *argv: str) -> tuple[int, dict]:
    peer = await start_peer(url, *argv)
    out, _ = await asyncio.wait_for(peer.communicate(), 60)
    return peer.returncode or 0, json.loads(out)


async def test_https_server_serves_pages_and_calls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    async with running_server("--tls-cert", str(cert), "--tls-key", str(key), scheme="https",
                              ready="serving plugin echo on https://") as (server, url, _):
        trusted = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/health", ssl=trusted) as response:
                assert response.status == 200
                assert (await response.json())["status"] == "ok"
            async with http.get(url + "/", ssl=trusted) as response:
                assert response.status == 200
                assert "text/html" in response.headers["Content-Type"]
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(url + "/health")  # not in the system's trust store
        code, report = await run_peer(url, "--seconds", "2", "--insecure")
        assert code == 0 and report["connected"] and report["seconds_received"] > 1
        code, report = await run_peer(url, "--seconds", "1")
        assert code == 1 and not report["connected"] and "certificate" in report["error"].lower()
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 30) == 0


@pytest.mark.parametrize("flags, says", [
    (["--tls-cert", "cert.pem"], "go together"),
    (["--tls-cert", "missing.pem", "--tls-key", "missing.key"], "cannot load"),
])
async def test_bad_tls_flags_exit_2_with_a_reason(tmp_path: Path, flags: list[str],
                                                  says: str) -> None:
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "signaling", "--port", str(free_tcp_port()), *flags,
        cwd=str(Path(__file__).resolve().parents[2]),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )
    _, err = await asyncio.wait_for(server.communicate(), 60)
    assert server.returncode == 2
    assert "error [tls_invalid]: tls:" in err.decode() and says in err.decode()
