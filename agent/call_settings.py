"""What every conversation's lifecycle is bounded by, whatever its transport.

Read by the leg (leg.py) that every transport builds on.
"""

from __future__ import annotations

from dataclasses import dataclass


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
