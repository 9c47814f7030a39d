"""Transport-level measurements of a finished test call, all on the call's t0 timeline.

- time to first agent audio: t0 → the arrival of the first received piece louder than codec
  noise (`LOUD_RMS`);
- round-trip delay of what was sent (the test signal): when the received stream started minus
  when the sent one did, plus the lag at which the received audio best matches the sent audio
  (`agent.testing.peer.echo`, the load-test-cheap form of `testsignal.measure_echo`), with
  its correlation, holes and lag spread;
- gaps: pauses between arrivals over 60 ms after the first second;
- jitter: the RFC 3550 interarrival jitter estimate (section 6.4.1) of the received pieces,
  their arrival times against their media positions;
- packets received and lost where the transport counts them (RTP sequence numbers).

The echo measurement's decimated channels are kept with the recordings
(`aligned.share_low_rate`) for the speech detection that follows (`run.analyse`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from agent.testing.peer import echo as echoes
from agent.testing.peer.aligned import share_low_rate
from agent.testing.peer.recording import LOUD_RMS, Recording
from agent.testing.peer.report import CallReport
from agent.testing.peer.transports.base import PeerCall

PEAK_BLOCK = 48000  # samples scanned at a time for the first loud one


@dataclass
class EchoDelay:
    delay_ms: float
    correlation: float
    holes: int
    lag_spread_ms: float
    windows: int = 0  # 250 ms windows scored (after the first second)
    matched: float = 0.0  # their mean correlation, the holes left out


def first_loud_time(recording: Recording, threshold: float = LOUD_RMS) -> float | None:
    """Seconds since t0 when the first piece louder than `threshold` RMS arrived."""
    times = recording.times()
    if not recording.keep_audio:
        for at, loud in zip(times, recording.loud, strict=False):
            if loud:
                return at
        return None
    samples = recording.joined()
    offsets = recording.offsets[: len(times)] + [len(samples)]
    # A piece's RMS is at most its peak, so every piece before the one holding the first
    # sample above `threshold` is quiet: start looking there (one pass, in blocks).
    first = None
    for block in range(0, len(samples), PEAK_BLOCK):
        above = np.abs(samples[block : block + PEAK_BLOCK]) > threshold
        if above.any():
            first = block + int(np.argmax(above))
            break
    if first is None:
        return None
    for index in range(max(0, bisect.bisect_right(offsets, first) - 1), len(times)):
        piece = samples[offsets[index] : offsets[index + 1]]
        if len(piece) and float(np.sqrt(np.dot(piece, piece) / len(piece))) > threshold:
            return times[index]
    return None


def interarrival_jitter(recording: Recording) -> float | None:
    """RFC 3550's running jitter estimate J (seconds) over the received pieces, or None with
    fewer than two."""
    if len(recording.arrivals) < 2:
        return None
    jitter = 0.0
    rate = recording.rate
    pairs = zip(recording.arrivals, recording.offsets, strict=True)
    previous_at, previous_offset = next(pairs)
    for at, offset in pairs:
        transit_change = (at - previous_at) - (offset - previous_offset) / rate
        jitter += (abs(transit_change) - jitter) / 16
        previous_at, previous_offset = at, offset
    return jitter


def echo_delay(sent: Recording, received: Recording) -> EchoDelay | None:
    """How long what was sent took to come back, on the t0 timeline; None without audio."""
    sent_start, received_start = sent.start_time(), received.start_time()
    if sent_start is None or received_start is None or not received.keep_audio:
        return None
    # Both streams placed on the t0 timeline (the later one padded at its start), so the lag
    # found is the delay itself; a lag can then never be negative, however the streams began.
    head = round((received_start - sent_start) * sent.rate)
    sent_samples, received_samples = sent.joined(), received.joined()
    if head > 0:
        received_samples = np.concatenate([np.zeros(head, np.float32), received_samples])
    elif head < 0:
        sent_samples = np.concatenate([np.zeros(-head, np.float32), sent_samples])
    echo, decimated = echoes.measure_keeping(sent_samples, received_samples, sent.rate)
    if decimated is not None:
        # Sample 0 of what was measured is sample -max(0, -head) of the sent recording and
        # -max(0, head) of the received one.
        share_low_rate(sent, decimated.sent, -max(0, -head), decimated.factor)
        share_low_rate(received, decimated.received, decimated.received_from - max(0, head),
                       decimated.factor)
    return EchoDelay(
        delay_ms=round(echo.lag_seconds * 1000, 1),
        correlation=round(echo.correlation, 3),
        holes=echo.holes,
        lag_spread_ms=round(echo.lag_spread_seconds * 1000, 1),
        windows=echo.windows,
        matched=round(echo.matched, 3),
    )


def measure_into(report: CallReport, call: PeerCall, echo: bool = True) -> CallReport:
    """Fill `report` with what `call` (finished) measured; `echo`: measure the round-trip
    delay of what was sent (the test signal against an echo)."""
    call.finish_recordings()
    report.transport = call.transport
    report.url = call.url
    report.call_id = report.call_id or call.call_id
    report.codec = report.codec or call.codec
    report.end_reason = call.end_reason
    if call.connected_at is not None:
        report.connected = True
        report.connect_seconds = round(call.connected_at, 3)
    report.seconds_sent = round(call.sent.seconds, 3)
    report.seconds_received = round(call.received.seconds, 3)
    first = first_loud_time(call.received)
    report.first_audio_ms = None if first is None else round(first * 1000, 1)
    gaps = call.received.gaps()
    report.gaps = len(gaps)
    report.max_gap_ms = round(max(gaps, default=0.0) * 1000, 1)
    report.loud_fraction = call.received.loud_fraction()
    jitter = call.jitter if call.jitter is not None else interarrival_jitter(call.received)
    report.jitter_ms = None if jitter is None else round(jitter * 1000, 2)
    report.packets_received = call.packets_received
    report.packets_lost = call.packets_lost
    report.events = [str(timed.event.get("type", timed.event.get("event"))) for timed in
                     call.events]
    report.event_times = [timed.t for timed in call.events]
    report.errors = [timed.event["error"] for timed in call.events
                     if timed.event.get("type") == "error"
                     and isinstance(timed.event.get("error"), dict)]
    report.transcript = "".join(
        str(timed.event.get("delta", "")) for timed in call.events
        if timed.event.get("type") == "response.output_audio_transcript.delta")
    report.dtmf_received = [str(timed.event.get("digit")) for timed in call.dtmf_received]
    if echo:
        delay = echo_delay(call.sent, call.received)
        if delay is not None:
            report.delay_ms = delay.delay_ms
            report.correlation = delay.correlation
            report.holes = delay.holes
            report.lag_spread_ms = delay.lag_spread_ms
    return report
