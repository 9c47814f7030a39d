"""`moshi-server`: the Moshi and PersonaPlex reference servers (`GET /api/chat` websocket).

Wire protocol: the persona goes in the query (`voice_prompt`, `text_prompt`); the server
prefills it and then sends the one-byte handshake `0x00`. After that binary messages flow both
ways, first byte = kind: `0x01` audio as Ogg-Opus pages (24 kHz mono), `0x02` a UTF-8 text
piece (server only). One conversation per server process; a busy server makes the client wait
or closes with 1013.

Ogg-Opus: Kyutai's `sphn` (the library the reference server and clients use), so pages
match what the server expects by construction, with a streaming reader that takes bytes and
returns PCM (PyAV can mux Ogg in memory but cannot demux a growing stream).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import numpy as np
import sphn
from yarl import URL

from .link import LinkRequest, UpstreamError, UpstreamLink, protocol_error
from .plugin import RemotePlugin

KIND_HANDSHAKE = 0x00
KIND_AUDIO = 0x01
KIND_TEXT = 0x02
BUSY_CLOSE_CODE = 1013  # "try again later"


class MoshiLink(UpstreamLink):
    protocol = "moshi-server"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Both live on the ticker thread only (encoding and decoding happen in `step`).
        self._writer = sphn.OpusStreamWriter(self.sample_rate)
        self._reader = sphn.OpusStreamReader(self.sample_rate)

    def connect_url(self, request: LinkRequest) -> str:
        query = {}
        if request.voice:
            query["voice_prompt"] = request.voice
        if request.instructions:
            query["text_prompt"] = request.instructions
        return str(URL(self.lease.url).update_query(query)) if query else self.lease.url

    async def handshake(self, ws: aiohttp.ClientWebSocketResponse, request: LinkRequest) -> None:
        message = await ws.receive()
        if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                            aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            if ws.close_code == BUSY_CLOSE_CODE:
                raise UpstreamError(
                    "upstream_busy", f"model server {self.label} is busy with another call",
                    status=503, pool_effect="full",
                )
            raise UpstreamError(
                "upstream_closed",
                f"model server {self.label} closed the connection before the handshake "
                f"(code {ws.close_code})", status=503, pool_effect="failed",
            )
        if message.type != aiohttp.WSMsgType.BINARY or message.data[:1] != bytes([KIND_HANDSHAKE]):
            raise protocol_error("the first message is not the 0x00 handshake")
        self.upstream_session_id = f"moshi@{self.label}"

    def on_message(self, message: aiohttp.WSMessage, arrived_at: float) -> None:
        if message.type != aiohttp.WSMsgType.BINARY:
            raise protocol_error(f"expected a binary message, got {message.type.name.lower()}")
        data: bytes = message.data
        if not data:
            raise protocol_error("an empty message")
        kind, payload = data[0], data[1:]
        if kind == KIND_AUDIO:
            self.file_audio(payload, arrived_at)
        elif kind == KIND_TEXT:
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise protocol_error("a text piece is not UTF-8") from None
            if text:
                self.file_text(text)
        elif kind != KIND_HANDSHAKE:
            raise protocol_error(f"unknown message kind 0x{kind:02x}")

    # -- ticker thread ----------------------------------------------------------------------

    def encode_input(self, frame: np.ndarray) -> bytes | None:
        pages = self._writer.append_pcm(frame)
        return bytes([KIND_AUDIO]) + pages if pages else None

    def decode_audio(self, payload: bytes) -> np.ndarray:
        try:
            pcm = self._reader.append_bytes(payload)
        except ValueError as exc:
            raise UpstreamError(
                "upstream_bad_audio", f"the model server sent audio that is not Ogg-Opus: {exc}"
            ) from None
        return np.asarray(pcm, dtype=np.float32).reshape(-1)


class MoshiServerPlugin(RemotePlugin):
    id = "moshi-server"
    link_class = MoshiLink
    default_capacity = 1  # the reference server holds one conversation per process
