"""`--log-format json`: a real server's lines are JSON objects, call lines carry the call id."""

from __future__ import annotations

import asyncio
import json
import logging

from agent.logs.json_log import JsonFormatter
from agent.task_owner import TaskOwner
from agent.testing.peer import run_call
from agent.webrtc.leg import new_call_id
from tests.support.server_process import read_until, running_server


def test_formatter_takes_the_call_id_from_the_task_and_fields_from_the_message() -> None:
    call_id = new_call_id()
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(JsonFormatter().format(record))

    logger = logging.getLogger("test.json_log")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def job() -> None:
        logger.info("send failed (%r); ending code=%d", OSError("x"), 7)

    async def main() -> None:
        await TaskOwner(call_id).spawn(job(), "send")
        logger.info("no call here")

    asyncio.run(main())
    first, second = (json.loads(line) for line in records)
    assert first["call_id"] == call_id and first["fields"] == {"code": "7"}
    assert first["level"] == "INFO" and first["logger"] == "test.json_log"
    assert first["time"].endswith("Z")
    assert second["call_id"] is None and second["event"] == "no call here"
    assert "worker" not in first  # one process: no worker field


def test_a_workers_lines_name_it() -> None:
    record = logging.LogRecord("signaling", logging.INFO, __file__, 1, "serving", (), None)
    assert json.loads(JsonFormatter(worker=1).format(record))["worker"] == 1


async def test_server_logs_json_lines_with_call_ids() -> None:
    async with running_server("--log-format", "json") as (server, url, lines):
        assert server.stderr is not None
        report, _, _ = await run_call(url, seconds=1.5)
        assert report.ok, report.error
        await asyncio.wait_for(read_until(server.stderr, "reason=", lines), 30)
    objects = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "call_id", "event", "fields"} <= set(o)
               for o in objects)
    start = next(o for o in objects if o["event"] == "call start")
    end = next(o for o in objects if o["event"] == "call end")
    assert start["call_id"] and start["call_id"] == end["call_id"]
    assert start["fields"]["plugin"] == "echo"
    assert end["fields"]["reason"]
