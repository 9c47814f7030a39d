"""One plain test call on any transport: connect, play, listen, hang up, measure.

What `python -m agent.peer URL` does without a script, on whichever `--transport`: play the
given audio (or the built-in test signal) once, keep the call up for `seconds`, then hang up
and measure. A call that fails keeps what it measured until then; its report says why, with
the `PeerError` code.
"""

from __future__ import annotations

import asyncio
import functools

import numpy as np

from agent.testing.peer.measure import measure_into
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports.base import PeerCall, PeerError, PeerOptions, open_call
from agent.testing.testsignal import make_test_signal


@functools.lru_cache(maxsize=8)
def test_signal(seconds: float) -> np.ndarray:
    """The built-in test signal, made once per length (calls of a load test share it)."""
    signal = make_test_signal(seconds)
    signal.flags.writeable = False
    return signal


async def place_call(url: str, transport: str = "webrtc", options: PeerOptions | None = None,
                     signal: np.ndarray | None = None, seconds: float = 5.0,
                     measure: bool = True) -> tuple[CallReport, PeerCall | None]:
    """(report, the finished call); the call is None when the transport could not be opened.
    `signal` defaults to the built-in test signal, whose echo delay is then measured.
    `measure=False` leaves `measure_into` to the caller (a load run measures its calls once
    they have all ended)."""
    report = CallReport(transport=transport, url=url)
    builtin = signal is None
    try:
        call = open_call(url, transport, options or PeerOptions())
    except PeerError as exc:
        report.error, report.error_code = exc.message, exc.code
        return report, None
    try:
        await call.connect()
        call.play(test_signal(seconds) if signal is None else signal)
        try:
            await asyncio.wait_for(call.ended.wait(), seconds)
            report.error = f"the call ended early ({call.end_reason})"
            report.error_code = "ended_early"
        except asyncio.TimeoutError:
            await call.hangup()
    except PeerError as exc:
        report.error, report.error_code = exc.message, exc.code
    finally:
        await call.close()
    if measure:
        # Off the event loop: the echo analysis would hold up the pacing of the other calls
        # a load test has in flight.
        await asyncio.to_thread(measure_into, report, call, builtin)
    return report, call
