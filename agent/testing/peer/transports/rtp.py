"""The plain RTP transport of the headless peer.

Two ways to reach the far end:
- `http(s)://HOST:PORT` — the agent's HTTP control: `POST /v1/telephony/rtp` creates a leg
  (codec, `dtmf_payload_type`, the session) and answers with its `local` address; the peer
  then streams G.711 20 ms packets to it from its own UDP socket, and the agent latches to
  that socket (symmetric RTP; the body names no `remote`). `hangup` is
  `DELETE /v1/telephony/rtp/{call_id}`. Server events come over the sideband websocket
  (`GET /v1/realtime?call_id=ID`) when the agent offers it.
- `rtp://HOST:PORT` — no control at all: packets go to that address and whatever comes back
  from that host is recorded, whatever port it comes from (a third-party RTP echo, a media
  server's port).

The local socket binds `extra["rtp_bind"]` (default: 127.0.0.1 for a loopback target,
0.0.0.0 otherwise) on `extra["rtp_port"]` (default: any free port).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any
from urllib.parse import urlparse

import aiohttp

from agent.testing.peer.transports.base import (
    BAD_URL,
    CONNECT_FAILED,
    REFUSED,
    TIMEOUT,
    UNSUPPORTED,
    PeerCall,
    PeerError,
    PeerOptions,
)
from agent.testing.peer.transports.narrowband import codec_name
from agent.testing.peer.transports.rtp_stream import Address, RtpStream
from agent.testing.peer.transports.sideband import Sideband
from agent.testing.peer.transports.telephone_events import DEFAULT_PAYLOAD_TYPE
from agent.testing.peer.transports.urls import url_problem

RTP_PATH = "/v1/telephony/rtp"


def bind_host_for(host: str) -> str:
    try:
        return "127.0.0.1" if ipaddress.ip_address(host).is_loopback else "0.0.0.0"
    except ValueError:
        return "127.0.0.1" if host == "localhost" else "0.0.0.0"


def parse_address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


class RtpCall(PeerCall):
    transport = "rtp"

    def __init__(self, url: str, options: PeerOptions | None = None) -> None:
        super().__init__(url, options)
        self.stream: RtpStream | None = None
        self._leg_url: str | None = None

    async def connect(self) -> None:
        self.start_clock()
        problem = url_problem(self.url, "rtp")
        if problem is not None:
            raise PeerError(BAD_URL, problem)
        parsed = urlparse(self.url)
        assert parsed.hostname is not None
        try:
            self.codec = codec_name(self.options.codec)
        except ValueError as exc:
            raise PeerError(UNSUPPORTED, str(exc)) from None
        dtmf_pt = int(self.options.extra.get("dtmf_payload_type", DEFAULT_PAYLOAD_TYPE))
        self.stream = RtpStream(self, self.codec, dtmf_pt)
        bind = str(self.options.extra.get("rtp_bind") or bind_host_for(parsed.hostname))
        await self.stream.bind(bind, int(self.options.extra.get("rtp_port", 0)))
        if parsed.scheme == "rtp":
            self.stream.strict_source_port = False
            if parsed.port is None:
                raise PeerError(BAD_URL, f"{self.url}: rtp:// needs a port")
            remote = (socket.gethostbyname(parsed.hostname), parsed.port)
        else:
            remote = await self._create_leg()
        self.connected_at = self.now()
        self.stream.start(remote)
        if parsed.scheme != "rtp":
            self._sideband = await Sideband.open_if(self, self.headers, self.url)

    async def _create_leg(self) -> Address:
        body: dict[str, Any] = {"codec": self.codec,
                                "dtmf_payload_type": self.options.extra.get(
                                    "dtmf_payload_type", DEFAULT_PAYLOAD_TYPE)}
        if self.options.session:
            body["session"] = self.options.session
        endpoint = self.url.rstrip("/") + RTP_PATH
        try:
            async with self.requests().post(endpoint, json=body,
                                            headers=self.headers) as response:
                payload = await response.json(content_type=None)
                if response.status != 201 or not isinstance(payload, dict):
                    raise PeerError(REFUSED, f"RTP leg refused: HTTP {response.status} "
                                    f"{payload}")
        except asyncio.TimeoutError:
            raise PeerError(TIMEOUT, f"{endpoint}: no answer within "
                            f"{self.options.timeout:g} s") from None
        except (aiohttp.ClientError, ValueError) as exc:
            raise PeerError(CONNECT_FAILED, f"{endpoint}: {exc or type(exc).__name__}") from None
        self.call_id = str(payload.get("call_id"))
        self._leg_url = f"{endpoint}/{self.call_id}"
        host, port = parse_address(str(payload.get("local")))
        if host in ("0.0.0.0", "::", ""):
            host = urlparse(self.url).hostname or host
        return host, port

    async def send_dtmf(self, digits: str) -> None:
        if self.stream is None:
            raise PeerError("closed", "the call is not connected")
        try:
            await self.stream.send_dtmf(digits)
        except ValueError as exc:
            raise PeerError("invalid_dtmf", str(exc)) from None

    async def end_remote(self, remote_ended: bool) -> None:
        if self._leg_url is not None and not remote_ended:
            try:
                async with self.requests().delete(self._leg_url,
                                                  headers=self.headers) as response:
                    await response.read()
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass  # gone already; the agent ends a silent leg on its own too

    async def close(self) -> None:
        if not await self.begin_close():
            return
        if self.stream is not None:
            await self.stream.close()
