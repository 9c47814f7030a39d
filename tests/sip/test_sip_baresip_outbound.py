"""baresip, a real softphone, receives an outbound call (`POST /v1/sip/calls`): it answers
by itself (`answermode=auto`), plays the test signal from a WAV and records what it hears;
the echo plugin's echo of it must correlate >= 0.9. Keys sent by the agent
(`POST /v1/realtime/calls/{id}/dtmf`) must be decoded by baresip's own RFC 4733 receiver,
which reports each as a `CALL_DTMF_START` event on its ctrl_tcp socket.

baresip runs headless on 127.0.0.1 with `-t` as its own time bound and is stopped by its
PID (test_sip_baresip.py's fixture pieces). Without baresip these tests skip (and fail
under CI).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from agent.testing.testsignal import make_test_signal, measure_echo
from tests.sip.helpers import HOST, SipServer, SipServerFactory, stop_process
from tests.sip.outbound_helpers import dialing_server, place, until_idle, wait_status
from tests.sip.test_sip_baresip import (
    Baresip,
    read_wav,
    require_baresip,
    write_config,
    write_wav,
)

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SECONDS = 4.0
LEAD = 0.5  # silence before the signal: the agent's leg opens as baresip starts sending
RATE = 8000
TAIL = 3.0  # silence after the signal: the keys are sent then, baresip hangs up after it
DIGITS = "15#"


STARTS = 3  # a free port picked here may be taken by another program before baresip binds it


async def start_baresip(binary: str, workdir: Path, wav: Path
                        ) -> tuple[asyncio.subprocess.Process, Baresip | None, int]:
    """One start of baresip on fresh ports: the process, its control socket (None when it
    did not come up) and its SIP port."""
    config, records = workdir / "baresip", workdir / "records"
    sip_port, ctrl_port = write_config(workdir, wav, RATE,
                                       ["g711", "aufile", "aubridge", "sndfile"], "phone",
                                       "answermode=auto;audio_codecs=PCMU/8000/1")
    with (workdir / "baresip.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            binary, "-f", str(config), "-t", "40", stdin=asyncio.subprocess.DEVNULL,
            stdout=log, stderr=asyncio.subprocess.STDOUT)
    for _ in range(100):
        if process.returncode is not None:
            break
        try:
            reader, writer = await asyncio.open_connection(HOST, ctrl_port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        return process, Baresip(process, reader, writer, records), sip_port
    return process, None, sip_port


@asynccontextmanager
async def answering_baresip(workdir: Path, wav: Path) -> AsyncIterator[tuple[Baresip, int]]:
    """baresip answering every call at once in PCMU, `wav` as its microphone; with the
    port it listens on for SIP."""
    binary = require_baresip()
    for _ in range(STARTS):
        process, phone, sip_port = await start_baresip(binary, workdir, wav)
        if phone is not None:
            break
        await stop_process(process)
        if "Address already in use" not in (workdir / "baresip.log").read_text(errors="replace"):
            break
    if phone is None:
        raise AssertionError("baresip's ctrl_tcp never listened: "
                             + (workdir / "baresip.log").read_text(errors="replace"))
    try:
        yield phone, sip_port
    finally:
        phone.writer.close()
        await stop_process(process)


async def send_dtmf(server: SipServer, call_id: str, digits: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(
            f"{server.url}/v1/realtime/calls/{call_id}/dtmf",
            json={"digits": digits}) as response:
        assert response.status == 200, await response.text()


async def test_baresip_answers_an_outbound_call_hears_its_echo_and_decodes_the_keys(
    start_sip: SipServerFactory, tmp_path: Path,
) -> None:
    signal = make_test_signal(SECONDS, RATE)
    wav = tmp_path / "speech.wav"
    write_wav(wav, np.concatenate([np.zeros(int(LEAD * RATE), np.float32), signal,
                                   np.zeros(int(TAIL * RATE), np.float32)]), RATE)
    server = await dialing_server(start_sip)
    async with answering_baresip(tmp_path, wav) as (phone, port):
        status, call, _ = await place(server, {"to": f"sip:phone@{HOST}:{port}"})
        assert status == 201, call
        await phone.event("CALL_ESTABLISHED")
        answered = await wait_status(server, call["id"], "answered")
        assert answered["sip_status"] == 200
        # The signal has played and its echo come back: now the keys, in the silent tail.
        await asyncio.sleep(LEAD + SECONDS + 1.0)
        await send_dtmf(server, call["id"], DIGITS)
        heard_keys = [str((await phone.event("CALL_DTMF_START", timeout=10))["param"])
                      for _ in DIGITS]
        # baresip hangs up when its WAV ends: a BYE from the far end.
        await phone.event("CALL_CLOSED", timeout=TAIL + 15)
        ended = await wait_status(server, call["id"], "ended")
        await until_idle(server)
        heard, heard_rate = read_wav(phone.recording("dec"))
    assert heard_keys == list(DIGITS), phone.events
    assert ended["reason"] == "remote_hangup", ended
    assert heard_rate == RATE
    # Scored over the echo's own span: the silent tail after it is no hole in the echo.
    lag = measure_echo(signal, heard, RATE).lag_seconds
    echo = measure_echo(signal, heard[:int((lag + SECONDS) * RATE)], RATE)
    print(f"\nbaresip answering PCMU: echo correlation {echo.correlation:.3f}, "
          f"lag {echo.lag_seconds:.3f} s, holes {echo.holes}; keys decoded {heard_keys}")
    assert echo.correlation >= 0.9, echo
