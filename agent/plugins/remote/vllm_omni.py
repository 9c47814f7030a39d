"""`vllm-omni`: PersonaPlex (or any duplex model) served by vllm-omni's duplex realtime API.

Wire protocol (`WS /v1/realtime?duplex=1`, JSON text frames): the first `session.update`
opens a session and the server answers `session.created` (`session.id` = `duplex-<uuid>`);
the client then streams one `input_audio_buffer.append` per 80 ms frame (pcm_f32le, 24 kHz,
base64, silence included so the model stays clocked) and ends with `session.close`. The
server streams `response.output_audio.delta` (pcm16 base64, any chunk size),
`response.output_audio_transcript.delta`/`.done` and `error`; every server event carries a
`server_event_seq`.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import aiohttp
import numpy as np

from agent.plugins.base import PluginError
from agent.plugins.remote.link import LinkRequest, UpstreamError, UpstreamLink, protocol_error
from agent.plugins.remote.plugin import RemotePlugin

log = logging.getLogger(__name__)

INPUT_FORMAT = "pcm_f32le"
OUTPUT_FORMAT = "pcm16"
CAPACITY_CODES = frozenset({"resource_exhausted"})
CAPACITY_TYPES = frozenset({"rate_limit_error"})
# Refusals a server sends when a session cannot open, and what they mean for the caller: a bad
# voice or session object is the caller's mistake (400; vllm-omni's duplex serving answers a
# session object its engine rejects with `invalid_session_config`), the rest are the server's
# state (503 / 504).
OPEN_REFUSAL_STATUS = {
    "invalid_voice": 400,
    "invalid_session_config": 400,
    "prefill_unavailable": 503,
    "model_path_unavailable": 503,
    "timeout": 504,
}
# Journaled events carry `server_event_seq`; these come from the handshake/transport layer
# and never do, so their lack of one is not an anomaly. (`session.expired` is sent with
# `journal=False` by serving.py's `OmniDuplexSessionHandler._apply_runtime_lifecycle`.)
UNSEQUENCED_EVENTS = frozenset({"session.created", "error", "session.expired"})
ENDING_EVENTS = frozenset({"session.closed", "session.expired"})
# vllm-omni's Realtime projection (realtime_output.py, `RealtimeOutputProjector`) names its
# output with the Realtime beta's names; OpenAI's GA names are the ones handled below.
EVENT_ALIASES = {
    "response.audio.delta": "response.output_audio.delta",
    "response.audio_transcript.delta": "response.output_audio_transcript.delta",
    "response.audio_transcript.done": "response.output_audio_transcript.done",
}


def _field(container: Any, key: str) -> Any:
    return container.get(key) if isinstance(container, dict) else None


def session_update(request: LinkRequest) -> dict[str, Any]:
    """The PersonaPlex preset: raw float input, pcm16 output, no server VAD, auto response."""
    session: dict[str, Any] = {
        "input_audio_format": INPUT_FORMAT,
        "output_audio_format": OUTPUT_FORMAT,
        "turn_detection": None,
        "extra_body": {"auto_response": True},
    }
    if request.model:
        session["model"] = request.model
    if request.voice:
        session["voice"] = request.voice
    if request.instructions:
        session["instructions"] = request.instructions
    return {"type": "session.update", "session": session}


def parse_event(message: aiohttp.WSMessage) -> dict[str, Any]:
    if message.type != aiohttp.WSMsgType.TEXT:
        raise protocol_error(f"expected a JSON text frame, got {message.type.name.lower()}")
    try:
        event = json.loads(message.data)
    except ValueError:
        raise protocol_error("a text frame is not JSON") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise protocol_error("an event is not an object with a string 'type'")
    return event


def upstream_error(event: dict[str, Any], *, opening: bool) -> UpstreamError:
    raw = event.get("error")
    if isinstance(raw, str):
        # A server without the duplex API answers `?duplex=1` with a plain-string error (and
        # a 1008 close): it can never serve these calls.
        return UpstreamError("upstream_unsupported", f"model server has no duplex API: {raw}",
                             status=503, pool_effect="failed")
    body = raw if isinstance(raw, dict) else {}
    code = str(body.get("code") or body.get("type") or "upstream_error")
    message = str(body.get("message") or "the model server reported an error")
    if code in CAPACITY_CODES or body.get("type") in CAPACITY_TYPES:
        return UpstreamError(code, f"model server is full: {message}", status=503,
                             pool_effect="full")
    if opening and code in OPEN_REFUSAL_STATUS:
        return UpstreamError(code, f"model server refused the session: {message}",
                             status=OPEN_REFUSAL_STATUS[code], pool_effect=None)
    prefix = "model server refused the session" if opening else "model server error"
    return UpstreamError(code, f"{prefix}: {message}", status=502)


class VllmOmniLink(UpstreamLink):
    protocol = "vllm-omni"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.last_server_event_seq: int | None = None
        self.seq_anomalies = 0
        self._odd_byte = b""  # pcm16 split across deltas at an odd byte count

    async def handshake(self, ws: aiohttp.ClientWebSocketResponse, request: LinkRequest) -> None:
        await ws.send_str(json.dumps(session_update(request)))
        while True:
            message = await ws.receive()
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING,
                                aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                raise UpstreamError(
                    "upstream_closed",
                    f"model server {self.label} closed the connection before session.created",
                    status=503, pool_effect="failed",
                )
            event = parse_event(message)
            self._check_seq(event)
            if event["type"] == "error":
                raise upstream_error(event, opening=True)
            if event["type"] == "session.created":
                session = event.get("session")
                if not isinstance(session, dict) or not isinstance(session.get("id"), str):
                    raise protocol_error("session.created without a session.id")
                self.upstream_session_id = session["id"]
                return

    def _check_seq(self, event: dict[str, Any]) -> None:
        seq = event.get("server_event_seq")
        if seq is None and event.get("type") in UNSEQUENCED_EVENTS:
            return
        if not isinstance(seq, int) or isinstance(seq, bool):
            self.seq_anomalies += 1
            return
        if self.last_server_event_seq is not None and seq != self.last_server_event_seq + 1:
            self.seq_anomalies += 1
            log.warning("upstream %s: server_event_seq jumped from %d to %d", self.label,
                        self.last_server_event_seq, seq)
        self.last_server_event_seq = seq

    def on_message(self, message: aiohttp.WSMessage, arrived_at: float) -> None:
        event = parse_event(message)
        self._check_seq(event)
        kind = EVENT_ALIASES.get(event["type"], event["type"])
        if kind == "response.output_audio.delta":
            self._file_audio_delta(event, arrived_at)
        elif kind == "response.output_audio_transcript.delta":
            delta = event.get("delta")
            if not isinstance(delta, str):
                raise protocol_error("a transcript delta without a string 'delta'")
            if delta:
                self.inbox.text(delta)
        elif kind == "response.output_audio_transcript.done":
            self.inbox.segment_end()
        elif kind == "error":
            error = upstream_error(event, opening=False)
            self.inbox.notice(PluginError(error.code, error.message, status=error.status))
        elif kind in ENDING_EVENTS:
            reason = (event.get("reason") or _field(event.get("event"), "reason")
                      or _field(event.get("session"), "close_reason"))
            raise UpstreamError(
                "upstream_session_closed", f"the model server ended the session ({reason})"
            )
        # Other events (response.created/done, session.updated, ...) carry nothing to play.

    def _file_audio_delta(self, event: dict[str, Any], arrived_at: float) -> None:
        audio_format = event.get("format", OUTPUT_FORMAT)
        rate = event.get("sample_rate_hz", self.sample_rate)
        if audio_format != OUTPUT_FORMAT or rate != self.sample_rate:
            raise UpstreamError(
                "upstream_format_unsupported",
                f"the model server sent {audio_format} at {rate} Hz; the agent asked for "
                f"{OUTPUT_FORMAT} at {self.sample_rate} Hz",
            )
        delta = event.get("delta")
        if not isinstance(delta, str):
            raise protocol_error("an audio delta without a string 'delta'")
        self.inbox.audio(delta, arrived_at)

    async def goodbye(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        await ws.send_str(json.dumps({"type": "session.close"}))

    # -- ticker thread ----------------------------------------------------------------------

    def encode_input(self, frame: np.ndarray) -> str:
        audio = base64.b64encode(frame.astype("<f4", copy=False).tobytes()).decode("ascii")
        return json.dumps({
            "type": "input_audio_buffer.append", "audio": audio,
            "format": INPUT_FORMAT, "sample_rate_hz": self.sample_rate,
        })

    def decode_audio(self, payload: str) -> np.ndarray:
        try:
            raw = self._odd_byte + base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise UpstreamError(
                "upstream_bad_audio", "the model server sent audio that is not valid base64"
            ) from None
        whole = len(raw) // 2 * 2
        self._odd_byte = raw[whole:]
        return np.frombuffer(raw[:whole], dtype="<i2").astype(np.float32) / 32768.0

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "last_server_event_seq": self.last_server_event_seq,
                "server_event_seq_anomalies": self.seq_anomalies}


class VllmOmniPlugin(RemotePlugin):
    id = "vllm-omni"
    link_class = VllmOmniLink
    default_capacity = 0  # vllm-omni batches many sessions; it says resource_exhausted when full
