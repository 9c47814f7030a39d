"""What every conversation's lifecycle is bounded by, whatever its transport.

Read by the leg (leg.py) that every transport builds on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecordLimits:
    """When a call's recording stops while the call goes on (0 turns a limit off); read by
    recording.py."""

    max_seconds: float = 3600.0  # audio recorded per call
    min_free_mb: float = 512.0  # free space in the recording folder's file system it leaves


@dataclass
class CallSettings:
    idle_timeout: float = 15.0  # seconds without inbound audio before a connected call ends
    connect_timeout: float = 20.0  # seconds from answer to ICE/DTLS connected
    max_call_seconds: float = 0.0  # 0 = unlimited
    playout_capacity_seconds: float = 2.0
    # Data-channel client events a caller may send: a sustained rate per second and a burst.
    client_event_rate: float = 10.0
    client_event_burst: int = 20
    record_dir: str | None = None  # --record-dir: record every call that does not opt out
    record_format: str = "flac"  # --record-format: flac or opus (Ogg)
    # --record-max-seconds: a call's recording is closed after this much audio (0 = no limit)
    record_max_seconds: float = RecordLimits.max_seconds
    # --record-min-free-mb: recording stops (or never starts) below this much free space
    record_min_free_mb: float = RecordLimits.min_free_mb

    @property
    def record_limits(self) -> RecordLimits:
        """What ends a recording while its call goes on (recording.py)."""
        return RecordLimits(max_seconds=self.record_max_seconds,
                            min_free_mb=self.record_min_free_mb)
