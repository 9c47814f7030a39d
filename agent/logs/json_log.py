"""`--log-format json`: one JSON object per line, with the call id on call-related lines.

Fields: `time` (ISO 8601, UTC), `level`, `logger`, `call_id` (or null), `event` (the message
without its call id and `key=value` pairs, e.g. "call end"), `fields` (those pairs), and
`message` (the full line, as the text format prints it); `exception` when there is one.

The call id comes, in order, from `extra={"call_id": ...}`, from the task that logged (a
call's or leg's tasks are named `<call id>:<job>`, see task_owner.py), or from an id in the
message itself. Redaction (agent.logs.redact) runs as a handler filter before this formatter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

from agent.worker_tag import ID_TOKEN_CHARS

# new_call_id() and TelephonyLeg ids: a kind prefix and an ID_TOKEN_CHARS-long token.
CALL_ID = re.compile(rf"\b((?:call|rtp|media_stream)_[A-Za-z0-9_-]{{{ID_TOKEN_CHARS}}})"
                     r"(?![A-Za-z0-9_-])")
FIELD = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)=(\S+)")


def call_id_of_task() -> str | None:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a worker thread
        return None
    if task is None:
        return None
    owner = task.get_name().partition(":")[0]
    return owner if CALL_ID.fullmatch(owner) else None


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker  # with --workers: which worker wrote the line

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        call_id = getattr(record, "call_id", None) or call_id_of_task()
        found = CALL_ID.search(message)
        if call_id is None and found is not None:
            call_id = found.group(1)
        fields = {key: value.rstrip(",;") for key, value in FIELD.findall(message)}
        event = CALL_ID.sub("", FIELD.sub("", message))
        event = " ".join(event.replace(" :", ":").split()).rstrip(":")
        body: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "call_id": call_id,
            "event": event,
            "fields": fields,
            "message": message,
        }
        if self.worker is not None:
            body["worker"] = self.worker
        if record.exc_info:
            body["exception"] = self.formatException(record.exc_info)
        return json.dumps(body, ensure_ascii=False, default=str)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="text (default) or json: one object per line with time, level, "
                        "logger, call_id, event, fields")


def use_json(root: logging.Logger | None = None, worker: int | None = None) -> None:
    """Switch every handler of the root logger to JSON lines (naming `worker` if given)."""
    for handler in (root or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter(worker))
