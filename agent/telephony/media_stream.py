"""The telephony media-stream websocket protocol (Twilio Media Streams shape), media side.

The bridge sends JSON text messages: `connected`, `start` (stream id, media format, custom
parameters), `media` (base64 μ-law, 20 ms = 160 bytes), `dtmf`, `mark`, `clear`, `stop`.
The agent sends `media` (base64 μ-law, 160 bytes every 20 ms, paced in real time; silence
when the model has nothing queued, so the bridge's clock never starves), `mark` (a mark the
bridge sent, answered once the agent audio queued before it has been sent), and `error`
(`{"event": "error", "streamSid", "error": {"code", "message"}}`) for a message it could
not use; the socket stays open after an error. A refused `start` (bad voice, server full)
is answered with an error and the socket is closed. Every bad message gets its `error`
answer, but the log gets at most one line a second per stream (`LogThrottle`), saying how
many were not logged, and a summary line when the stream ends if any were held back.

`start.customParameters` carry the session config: `voice`, `instructions` (alias
`persona`), and `extra_body` (a JSON object encoded as a string, since bridges only pass
strings). Other parameters are kept as metadata and otherwise ignored.

Signaling owns the socket and hands this session a `send_text` and a `close_socket`.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent.end_reason import Ending, EndReason, start_refused
from agent.errors import AgentError
from agent.leg import prepare_config
from agent.logs.log_safe import LogThrottle, held_back_note, printable
from agent.plugins.base import SessionConfig
from agent.realtime import client_json
from agent.telephony.codec import PCMA, PCMU, NarrowbandCodec
from agent.telephony.leg import DTMF_BURST, DTMF_DIGITS, DTMF_RATE, TelephonyLeg
from agent.telephony.marks import MarkQueue

if TYPE_CHECKING:
    from agent.call_settings import CallSettings
    from agent.media_agent import MediaAgent

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024
MAX_MEDIA_BYTES = 8000  # one second of μ-law in one message is already far from normal
MAX_NAME_CHARS = 256
LOG_INTERVAL = 1.0  # seconds: at most one line per stream this often about bad messages
ENCODINGS: dict[str, NarrowbandCodec] = {"audio/x-mulaw": PCMU, "audio/x-alaw": PCMA}
SESSION_PARAMETERS = ("voice", "instructions", "persona", "extra_body")

# WebSocket close codes for a refused start.
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN = 1013

SendText = Callable[[str], Awaitable[None]]
CloseSocket = Callable[[int, str], Awaitable[None]]


class ProtocolError(AgentError):
    """A media-stream message the agent cannot act on."""


class MediaStreamLeg(TelephonyLeg):
    id_prefix = "media_stream"
    transport = "media-stream"

    def __init__(self, agent: MediaAgent, send_text: SendText, close_socket: CloseSocket,
                 settings: CallSettings | None = None) -> None:
        super().__init__(agent, PCMU, settings)
        self._send_text = send_text
        self._close_socket = close_socket
        self.stream_sid: str | None = None
        self.call_sid: str | None = None
        self.custom_parameters: dict[str, str] = {}
        self.marks = MarkQueue()
        self.malformed_messages = 0
        self.marks_answered = 0
        self.started = False
        self._malformed_log = LogThrottle(LOG_INTERVAL)
        self._failure_log = LogThrottle(LOG_INTERVAL)
        self.start_watchdog()  # a socket that never sends `start` is ended by connect_timeout

    # -- inbound messages -------------------------------------------------------------------

    async def handle_message(self, raw: str | bytes) -> None:
        """One message from the bridge. Never raises for bad input; answers with `error`."""
        try:
            message = parse_message(raw)
            await self._dispatch(message)
        except ProtocolError as exc:
            self.malformed_messages += 1
            self._log_malformed(exc)
            await self._send_error(exc.code, exc.message)
        except Exception:  # a bug here must not cost the caller the call
            held = self._failure_log.admit()
            if held is not None:
                log.exception("media stream %s: message handling failed%s", self.id,
                              held_back_note(held, "failures"))
            await self._send_error("server_error", "the message could not be handled")

    def _log_malformed(self, exc: ProtocolError) -> None:
        """One line a second at most: a client sending nothing but bad messages must not
        turn each into a log line."""
        held = self._malformed_log.admit()
        if held is not None:
            log.error("media stream %s: %s: %s%s", self.id, exc.code, printable(exc.message),
                      held_back_note(held, "malformed messages"))

    def _log_held_back(self) -> None:
        """At the end of the stream: what the throttles held back, if anything."""
        malformed = self._malformed_log.take_held_back()
        if malformed:
            log.error("media stream %s: %d more malformed messages not logged "
                      "(%d malformed in all)", self.id, malformed, self.malformed_messages)
        failures = self._failure_log.take_held_back()
        if failures:
            log.error("media stream %s: %d more message handling failures not logged",
                      self.id, failures)

    async def _dispatch(self, message: dict[str, Any]) -> None:
        event = message["event"]
        if event == "media":
            self._on_media(message)
        elif event == "start":
            await self._on_start(message)
        elif event == "connected":
            return
        elif event == "mark":
            self._on_mark(message)
        elif event == "clear":
            self.playout.clear()
        elif event == "dtmf":
            await self._on_dtmf(message)
        elif event == "stop":
            await self.close(EndReason.STOP)
        else:
            raise ProtocolError("unknown_event", f"unknown event '{event}'")

    async def _on_start(self, message: dict[str, Any]) -> None:
        if self.started:
            raise ProtocolError("already_started", "the stream has already started")
        start = _object_field(message, "start")
        stream_sid = start.get("streamSid", message.get("streamSid"))
        if not isinstance(stream_sid, str) or not stream_sid:
            raise ProtocolError("missing_stream_sid", "'start.streamSid' must be a string")
        codec = _codec_of(start.get("mediaFormat"))
        parameters = start.get("customParameters") or {}
        if not isinstance(parameters, dict):
            raise ProtocolError("invalid_parameters", "'start.customParameters' must be an object")
        self.stream_sid = stream_sid
        call_sid = start.get("callSid")
        self.call_sid = call_sid if isinstance(call_sid, str) else None
        self.custom_parameters = {str(k): str(v) for k, v in parameters.items()}
        self.codec = codec
        try:
            session_config = session_config_from_parameters(parameters)
            await self.open_plugin_slot(await prepare_config(self.plugin, session_config))
        except AgentError as exc:
            # Without a session the stream cannot do anything: say why, then hang up.
            log.warning("media stream %s: start refused: %s: %s", self.id, exc.code,
                        printable(exc.message))
            await self._send_error(exc.code, exc.message)
            close_code = CLOSE_TRY_AGAIN if exc.status == 503 else CLOSE_POLICY
            await self._close_socket(close_code, exc.code)
            await self.close(start_refused(exc.code))
            return
        self.started = True
        self.start_sending()
        log.info("media stream %s start stream=%s call=%s codec=%s", self.id,
                 printable(stream_sid), printable(self.call_sid), codec.name)

    def _on_media(self, message: dict[str, Any]) -> None:
        if not self.started:
            raise ProtocolError("not_started", "'media' before 'start'")
        media = _object_field(message, "media")
        track = media.get("track", "inbound")
        if track not in ("inbound", "inbound_track"):
            return  # a bridge streaming both tracks also sends the agent's own audio back
        payload = media.get("payload")
        if not isinstance(payload, str):
            raise ProtocolError("invalid_payload", "'media.payload' must be a base64 string")
        if len(payload) > MAX_MEDIA_BYTES * 4 // 3 + 4:
            raise ProtocolError("payload_too_large",
                                f"'media.payload' is over {MAX_MEDIA_BYTES} bytes")
        try:
            audio = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError("invalid_payload", "'media.payload' is not valid base64") from None
        self.push_inbound(self.codec.decode(audio))

    def _on_mark(self, message: dict[str, Any]) -> None:
        name = _object_field(message, "mark").get("name")
        if not isinstance(name, str) or len(name) > MAX_NAME_CHARS:
            raise ProtocolError(
                "invalid_mark", f"'mark.name' must be a string of at most {MAX_NAME_CHARS} chars")
        if not self.started:
            raise ProtocolError("not_started", "'mark' before 'start'")
        if not self.marks.add(name, self.queued_samples):
            raise ProtocolError("too_many_marks", "too many marks are waiting for their audio")

    async def _on_dtmf(self, message: dict[str, Any]) -> None:
        digit = _object_field(message, "dtmf").get("digit")
        if not isinstance(digit, str) or digit.upper() not in DTMF_DIGITS:
            raise ProtocolError("invalid_dtmf", "'dtmf.digit' must be one of 0-9, *, #, A-D")
        if not self.started:
            raise ProtocolError("not_started", "'dtmf' before 'start'")
        if not self.admit_dtmf():
            raise ProtocolError(
                "rate_limited",
                f"at most {DTMF_RATE:g} DTMF digits a second (bursts of {DTMF_BURST})")
        await self.dtmf(digit.upper())

    # -- outbound ---------------------------------------------------------------------------

    async def send_chunk(self, payload: bytes) -> None:
        await self._send_text(json.dumps({
            "event": "media",
            "streamSid": self.stream_sid,
            "media": {"payload": base64.b64encode(payload).decode("ascii")},
        }))
        # Marks go out from this task, after the media they follow, so they stay in order.
        for name in self.marks.due(self.consumed_samples):
            self.marks_answered += 1
            await self._send_text(json.dumps({
                "event": "mark", "streamSid": self.stream_sid, "mark": {"name": name},
            }))

    def deliver(self, event: dict[str, Any]) -> None:
        if event.get("type") != "error":
            return  # the protocol has a message for errors only
        error = event.get("error", {})
        self.tasks.spawn(self._send_error(error.get("code", "error"), error.get("message", "")),
                         "error")

    async def _send_error(self, code: str, message: str) -> None:
        try:
            await self._send_text(json.dumps({
                "event": "error", "streamSid": self.stream_sid,
                "error": {"code": code, "message": message},
            }))
        except (ConnectionError, RuntimeError) as exc:
            log.debug("media stream %s: error not sent: %r", self.id, exc)

    async def close_socket(self, reason: Ending) -> None:
        try:
            await self._close_socket(1000, reason[:100])
        finally:
            self._log_held_back()

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "stream_sid": self.stream_sid,
            "bridge_call_sid": self.call_sid,
            "malformed_messages": self.malformed_messages,
            "marks_pending": len(self.marks),
            "marks_answered": self.marks_answered,
        }


def parse_message(raw: str | bytes) -> dict[str, Any]:
    if isinstance(raw, bytes):
        raise ProtocolError("binary_message", "messages must be JSON text, not binary")
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError("message_too_large",
                            f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
    return client_json.load_object(raw, "message", "event", ProtocolError)


def _object_field(message: dict[str, Any], key: str) -> dict[str, Any]:
    value = message.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(f"invalid_{key}", f"'{key}' must be an object")
    return value


def _codec_of(media_format: Any) -> NarrowbandCodec:
    if media_format is None:
        return PCMU  # the convention's only format when a bridge leaves it out
    if not isinstance(media_format, dict):
        raise ProtocolError("invalid_media_format", "'start.mediaFormat' must be an object")
    encoding = str(media_format.get("encoding", "audio/x-mulaw")).lower()
    codec = ENCODINGS.get(encoding)
    if codec is None:
        raise ProtocolError("unsupported_encoding",
                            f"encoding '{encoding}' is not supported (audio/x-mulaw, audio/x-alaw)")
    if media_format.get("sampleRate", 8000) != 8000 or media_format.get("channels", 1) != 1:
        raise ProtocolError("unsupported_media_format", "only 8000 Hz mono is supported")
    return codec


def session_config_from_parameters(parameters: dict[str, Any]) -> SessionConfig:
    """customParameters → SessionConfig (shape only; the plugin validates the values)."""
    instructions = parameters.get("instructions", parameters.get("persona"))
    extra_body: Any = parameters.get("extra_body")
    if isinstance(extra_body, str):
        try:
            extra_body = client_json.loads(extra_body)
        except client_json.ClientJsonError:
            raise AgentError("invalid_session",
                              "customParameters.extra_body must be a JSON object",
                              param="customParameters.extra_body") from None
    return SessionConfig.from_json(
        {"voice": parameters.get("voice"), "instructions": instructions,
         "extra_body": extra_body},
        param="customParameters",
    )
