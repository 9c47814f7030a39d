"""Malformed HTTP is the client's mistake: one INFO line a second, not a traceback each.

aiohttp answers a request its parser refuses (a bad method, `Content-Length` beside
`Transfer-Encoding`, a broken chunk) with 400 and closes the connection, as it should, but
logs each at ERROR with a full traceback on `aiohttp.server`: any client could write
fifteen lines into the server's log per request. This filter on that logger turns such a
record into one INFO line without the traceback, at most one a second with how many were
held back. Errors of the server itself still log as they did.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

from agent.logs.log_safe import LogThrottle, held_back_note, printable

SERVER_LOGGER = "aiohttp.server"


class BadRequestFilter(logging.Filter):
    def __init__(self, throttle: LogThrottle | None = None) -> None:
        super().__init__()
        self.throttle = throttle or LogThrottle(1.0)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError) or (exc.code or 400) >= 500:
            return True
        held_back = self.throttle.admit()
        if held_back is None:
            return False
        first_line = str(exc.message).strip().splitlines()[0] if exc.message else ""
        record.msg = "malformed request refused with %d: %s%s"
        record.args = (exc.code or 400, printable(first_line),
                       held_back_note(held_back, "malformed requests"))
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Once per process, before serving."""
    logger = logging.getLogger(SERVER_LOGGER)
    if not any(isinstance(f, BadRequestFilter) for f in logger.filters):
        logger.addFilter(BadRequestFilter())
