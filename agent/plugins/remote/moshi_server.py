"""`moshi-server`: the Moshi and PersonaPlex reference servers (`GET /api/chat` websocket).

Wire protocol: the persona goes in the query (`voice_prompt`, `text_prompt`); the server
prefills it and then sends the one-byte handshake `0x00`. After that binary messages flow both
ways, first byte = kind: `0x01` audio as Ogg-Opus pages (24 kHz mono), `0x02` a UTF-8 text
piece (server only). One conversation per server process; a busy server makes the client wait
or closes with 1013.

Two kinds of server speak it (`--upstream-kind`):
- `personaplex` (NVIDIA's): reads `voice_prompt` and `text_prompt` from the query, with no
  default (without them it raises and drops the socket; an empty `text_prompt` or a `seed`
  parameter crashes it), so both are always sent: the caller's, else the plugin's defaults.
- `kyutai` (`python -m moshi.server`): reads no query parameter and has no persona; nothing
  is sent, and a caller's voice or persona is logged as ignored.
A socket that closes before the handshake after a successful upgrade is the server refusing
this request (an unknown voice file, say): a call error, not a sign the server is down. A
handshake that never comes means the server is busy with someone else's conversation (it
holds one behind a lock), not that it is broken.

Ogg-Opus: Kyutai's `sphn` (the library the reference server and clients use), so pages
match what the server expects by construction, with a streaming reader that takes bytes and
returns PCM (PyAV can mux Ogg in memory but cannot demux a growing stream).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp
import numpy as np
import sphn
from yarl import URL

from agent.plugins.base import PluginError, PluginFlag, PluginOptions, SessionConfig
from agent.plugins.moshi_defaults import DEFAULT_PERSONA, DEFAULT_VOICE
from agent.plugins.remote.link import LinkRequest, UpstreamError, UpstreamLink, protocol_error
from agent.plugins.remote.plugin import RemotePlugin

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; a typing-only name (requires-python is 3.10)

log = logging.getLogger(__name__)

KIND_HANDSHAKE = 0x00
KIND_AUDIO = 0x01
KIND_TEXT = 0x02
BUSY_CLOSE_CODE = 1013  # "try again later"
UPSTREAM_KINDS = ("personaplex", "kyutai")
# Pieces such as `<s>` or `<pad>` are the tokenizer's control symbols, never words.
CONTROL_PIECE = re.compile(r"<[^<>\s]{1,16}>")


def visible_text(piece: str) -> str:
    """A transcript piece without the tokenizer's control symbols."""
    return CONTROL_PIECE.sub("", piece)


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
            # The upgrade succeeded, so the server is up: it refused this session's request.
            raise UpstreamError(
                "upstream_refused_session",
                f"model server {self.label} closed the session before it opened (code "
                f"{ws.close_code}): it could not use this request's voice or persona",
                status=400, pool_effect=None,
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
            self.inbox.audio(payload, arrived_at)
        elif kind == KIND_TEXT:
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                raise protocol_error("a text piece is not UTF-8") from None
            text = visible_text(text)
            if text:
                self.inbox.text(text)
        elif kind != KIND_HANDSHAKE:
            raise protocol_error(f"unknown message kind 0x{kind:02x}")

    def handshake_timed_out(self) -> UpstreamError:
        # One conversation per server behind a lock: a session that does not open in time is
        # waiting for someone else's call to end.
        return UpstreamError(
            "upstream_busy", f"model server {self.label} is busy with another conversation; "
            "retry later", status=503, pool_effect="full",
        )

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
    # Each worker would count that one seat as its own: keep every call in one process.
    runs_per_worker = False
    upstream_kind: str = "personaplex"  # this instance's --upstream-kind
    flags: ClassVar[tuple[PluginFlag, ...]] = (*RemotePlugin.flags, PluginFlag(
        "--upstream-kind", "which reference server the --upstream URLs are: personaplex "
        "(NVIDIA's) always gets a voice and a persona (the caller's, else the defaults); "
        "kyutai's server has no persona, so none is sent", default="personaplex",
        choices=UPSTREAM_KINDS))

    @classmethod
    def from_options(cls, options: PluginOptions) -> Self:
        kind = str(options.extra.get("upstream_kind") or "personaplex")
        if kind not in UPSTREAM_KINDS:
            raise PluginError("invalid_option", f"--upstream-kind must be one of "
                              f"{', '.join(UPSTREAM_KINDS)}", status=500)
        plugin = super().from_options(options)
        plugin.upstream_kind = kind
        if kind == "kyutai":
            log.warning("moshi-server: Kyutai's server has no voice or persona prompt; callers' "
                        "voice and instructions are ignored")
        return plugin

    def link_request(self, session_config: SessionConfig) -> LinkRequest:
        if self.upstream_kind == "kyutai":
            if session_config.voice or session_config.instructions:
                log.info("moshi-server: Kyutai's server ignores the caller's voice and persona")
            return LinkRequest(model=self.model)
        persona = (session_config.instructions or "").strip() or DEFAULT_PERSONA
        return LinkRequest(voice=session_config.voice or self.voice or DEFAULT_VOICE,
                           instructions=persona, model=self.model)
