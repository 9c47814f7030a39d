"""`--workers 2`: a request one worker passes to another is logged with the client's address.

Between workers a request travels over the receiving worker's private unix socket, which
knows no client address; the forwarding worker sends the address along (signed, as the rest
of the forwarded request), so the receiving worker's access log and its own log lines name
the client, as they do for a request it accepted itself.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.workers.test_workers import two_workers

ACCESS = re.compile(r"^\S+ \S+ INFO (w\d) aiohttp\.access: (\S*) \[[^\]]*\] \"(\S+) (\S+)")
SIDEBAND = re.compile(r"INFO (w\d) signaling\.sideband: call (\S+): sideband open from (\S*)$")


async def read_lines_until(stream: asyncio.StreamReader, lines: list[str],
                           done: Callable[[list[str]], bool],
                           timeout: float) -> None:
    """Read the server's log into `lines` until `done(lines)` holds."""
    async def read() -> None:
        while not done(lines):
            line = (await stream.readline()).decode()
            if not line:
                raise AssertionError("the server ended early:\n" + "".join(lines))
            lines.append(line.rstrip("\n"))
    await asyncio.wait_for(read(), timeout)


async def test_requests_passed_between_workers_log_the_clients_address(tmp_path: Path) -> None:
    async with two_workers(tmp_path / "workers") as workers:
        calls = [await workers.call_on(index) for index in (0, 1)]
        paths = [str(call.location) for call in calls]
        stderr = workers.process.stderr
        assert stderr is not None
        lines: list[str] = []
        async with aiohttp.ClientSession() as http:
            # Whichever worker accepts them, one of the two calls is the other worker's: its
            # GET is forwarded and its sideband relayed.
            for path in paths:
                async with http.get(workers.url + path) as response:
                    assert response.status == 200, await response.text()
            sidebands = [await http.ws_connect(f"{workers.url}/v1/realtime?call_id="
                                               f"{call.call_id}") for call in calls]
            try:
                def seen(lines: list[str]) -> bool:
                    opened = [m for m in map(SIDEBAND.search, lines) if m]
                    gets = [m for m in map(ACCESS.search, lines)
                            if m and m.group(4) in paths and m.group(3) == "GET"]
                    return len(opened) >= 2 and len(gets) >= 3
                await read_lines_until(stderr, lines, seen, 30)
            finally:
                for sideband in sidebands:
                    await sideband.close()
    log = "\n".join(lines)
    opened = [m for m in map(SIDEBAND.search, lines) if m]
    assert {m.group(2) for m in opened} == {call.call_id for call in calls}, log
    assert [m.group(3) for m in opened] == ["127.0.0.1", "127.0.0.1"], log
    gets = [m for m in map(ACCESS.search, lines) if m and m.group(4) in paths]
    # The forwarded GET is logged twice: by the worker that forwarded it and by the owner.
    assert len(gets) >= 3, log
    assert {m.group(2) for m in gets} == {"127.0.0.1"}, log
