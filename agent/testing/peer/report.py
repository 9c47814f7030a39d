"""What a test call reports: `CallReport` (one call: what happened, what was measured, the
checks) and `CheckResult` (one expectation with its measured value and threshold).

Plain dataclasses of JSON values (`to_json()`), so a report is written as it is, read back by
a CI job, and compared across runs. Times are seconds or milliseconds on the call's t0
timeline (connect start), as their names say.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CheckResult:
    name: str
    passed: bool
    value: float | str | None = None  # what was measured
    threshold: float | str | None = None  # what it was held against
    unit: str = ""
    message: str = ""  # one line: why it failed, or what passed
    t: float | None = None  # seconds since t0 where the check was decided

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CallReport:
    # What happened (the legacy WebRTC report's fields first, unchanged).
    connected: bool = False
    error: str | None = None
    call_id: str | None = None
    codec: str | None = None
    connect_seconds: float | None = None
    seconds_sent: float = 0.0
    seconds_received: float = 0.0
    delay_ms: float | None = None  # round-trip delay of the test signal
    correlation: float | None = None
    holes: int | None = None  # 250 ms windows after the first second that did not come back
    lag_spread_ms: float | None = None
    gaps: int = 0
    max_gap_ms: float = 0.0
    loud_fraction: float | None = None  # count-only calls: share of the echo that was audio
    events: list[str] = field(default_factory=list)  # event types in arrival order
    transcript: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)  # `error` events' bodies
    # Added with the transports: which, how it ended, and the t0-timeline measurements.
    transport: str = "webrtc"
    url: str = ""
    error_code: str | None = None  # a PeerError's code when the call failed
    end_reason: str | None = None
    first_audio_ms: float | None = None  # t0 → the first loud received audio
    jitter_ms: float | None = None  # RFC 3550 interarrival jitter of the received audio
    packets_received: int | None = None
    packets_lost: int | None = None  # where the transport knows it (RTP sequence numbers)
    event_times: list[float] = field(default_factory=list)  # seconds since t0, per event
    dtmf_received: list[str] = field(default_factory=list)
    # The conversation: speech segments of both channels ([start, end] seconds since t0, from
    # the voice-activity detector), the turn-taking figures, and the echo's speech quality.
    name: str = ""  # the script's name (the JUnit suite), or "call"
    caller_speech: list[list[float]] = field(default_factory=list)
    agent_speech: list[list[float]] = field(default_factory=list)
    response_latency_ms: list[float] = field(default_factory=list)  # caller stops → agent speaks
    barge_in_stop_ms: list[float] = field(default_factory=list)  # caller cuts in → agent stops
    pesq: float | None = None  # ITU-T P.862 MOS-LQO of the echo against what was sent
    pesq_mode: str | None = None  # "nb" (8 kHz) or "wb" (16 kHz)
    pesq_error: str | None = None
    recording_path: str | None = None  # --record-dir: the stereo WAV (caller left, agent right)
    timeline_path: str | None = None  # --timeline: the PNG
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Connected, no error, audio came back, and every check passed."""
        return (self.connected and self.error is None and self.seconds_received > 0
                and all(check.passed for check in self.checks))

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["ok"] = self.ok
        return body


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear between closest ranks), None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (rank - low), 3)


BUSY_SHARE = 0.9  # the peer's loop thread busier than this (of one core) limits its calls

AGGREGATED = ("connect_seconds", "first_audio_ms", "delay_ms", "jitter_ms", "max_gap_ms",
              "packets_lost", "pesq")


@dataclass
class OwnLoad:
    """The peer's own CPU and pacing during a run of calls (own_load.py measures it)."""

    seconds: float = 0.0  # wall time while the calls ran
    loop_cpu_seconds: float = 0.0  # the event loop thread's CPU meanwhile
    busiest_share: float = 0.0  # its CPU / wall in the busiest whole INTERVAL (one core = 1)
    process_cpu_seconds: float = 0.0  # the whole process's CPU while the calls ran
    analysis_cpu_seconds: float = 0.0  # the process's CPU measuring them afterwards
    call_seconds: float = 0.0  # the calls' audio sent, summed
    tick_late_max_ms: float = 0.0  # the latest a send tick ran after its time

    @property
    def share(self) -> float:
        """The loop thread's CPU over the whole run, as a share of one core."""
        return self.loop_cpu_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_call_second(self) -> float | None:
        """The process's CPU while the calls ran, per second of call."""
        if self.call_seconds <= 0:
            return None
        return self.process_cpu_seconds / self.call_seconds

    def warning(self) -> str | None:
        """One line when the peer itself was busy enough to limit its calls, else None."""
        if self.busiest_share < BUSY_SHARE:
            return None
        return (f"the peer's event loop was busy {self.busiest_share:.0%} of a core at its "
                f"busiest (send tick up to {self.tick_late_max_ms:.0f} ms late): the figures "
                "may measure the peer, not the agent; run fewer calls per peer process")

    def to_json(self) -> dict[str, Any]:
        per_call = self.cpu_per_call_second
        return {
            "seconds": round(self.seconds, 3),
            "loop_cpu_seconds": round(self.loop_cpu_seconds, 3),
            "share": round(self.share, 3),
            "busiest_share": round(self.busiest_share, 3),
            "process_cpu_seconds": round(self.process_cpu_seconds, 3),
            "cpu_per_call_second": None if per_call is None else round(per_call, 5),
            "analysis_cpu_seconds": round(self.analysis_cpu_seconds, 3),
            "tick_late_max_ms": round(self.tick_late_max_ms, 1),
        }


@dataclass
class RunReport:
    """Many calls (`--repeat N`, `--concurrency M`): each call's report and p50/p95 over them
    of every measurement and every numeric check value (by check name)."""

    calls: list[CallReport] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole run
    concurrency: int = 1
    own_load: OwnLoad | None = None  # the peer's own CPU and pacing during the run

    @property
    def ok(self) -> bool:
        return bool(self.calls) and all(call.ok for call in self.calls)

    def samples(self) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for call in self.calls:
            for name in AGGREGATED:
                value = getattr(call, name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    found.setdefault(name, []).append(float(value))
            for name in ("response_latency_ms", "barge_in_stop_ms"):
                found.setdefault(name, []).extend(getattr(call, name))
            for check in call.checks:
                if isinstance(check.value, (int, float)) and not isinstance(check.value, bool):
                    found.setdefault(f"check:{check.name}", []).append(float(check.value))
        return {name: values for name, values in found.items() if values}

    def aggregates(self) -> dict[str, dict[str, float | int | None]]:
        return {name: {"n": len(values), "p50": percentile(values, 50),
                       "p95": percentile(values, 95)}
                for name, values in self.samples().items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "calls": [call.to_json() for call in self.calls],
            "passed": sum(1 for call in self.calls if call.ok),
            "failed": sum(1 for call in self.calls if not call.ok),
            "seconds": round(self.seconds, 3),
            "concurrency": self.concurrency,
            "aggregates": self.aggregates(),
            **({"peer_load": self.own_load.to_json()} if self.own_load is not None else {}),
        }
