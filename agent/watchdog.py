"""When a leg has to end on its own: never connected, caller gone quiet, or out of time.

Pure bookkeeping on monotonic seconds, so the rules are tested without waiting for them.

A leg whose transport has no connection to wait for (a SIP call's RTP) may set
`media_timeout` instead: the far end's media must be heard within that many seconds of the
start, and then never fall silent for longer; either ends the leg `media_timeout`.
"""

from __future__ import annotations

import time

from agent.call_settings import CallSettings
from agent.end_reason import EndReason


class Watchdog:
    def __init__(self, settings: CallSettings, now: float | None = None) -> None:
        self.settings = settings
        self.started_at = time.monotonic() if now is None else now
        self.media_started_at: float | None = None  # connected / first caller audio
        self.last_inbound_at: float | None = None
        self.media_timeout: float | None = None  # replaces connect and idle timeouts when set

    def media_started(self, now: float | None = None) -> None:
        """The transport is up (WebRTC connected, or the first caller audio arrived)."""
        if self.media_started_at is None:
            self.media_started_at = time.monotonic() if now is None else now

    def heard(self, now: float | None = None) -> None:
        """Caller audio arrived."""
        self.last_inbound_at = time.monotonic() if now is None else now

    def verdict(self, now: float) -> EndReason | None:
        """Why the leg must end now (an end reason), or None while it may go on."""
        settings = self.settings
        media = self.media_timeout
        if self.media_started_at is None:
            if media is not None:
                return EndReason.MEDIA_TIMEOUT if now - self.started_at > media else None
            if now - self.started_at > settings.connect_timeout:
                return EndReason.CONNECT_TIMEOUT
            return None
        silent = now - (self.last_inbound_at or self.media_started_at)
        if media is not None and silent > media:
            return EndReason.MEDIA_TIMEOUT
        if media is None and silent > settings.idle_timeout:
            return EndReason.IDLE_TIMEOUT
        limit = settings.max_call_seconds
        if limit and now - self.media_started_at > limit:
            return EndReason.MAX_CALL_SECONDS
        return None
