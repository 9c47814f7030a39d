"""Speech quality of what came back against what was sent: PESQ (ITU-T P.862), through the
`pesq` package (the ITU reference code), for calls to an echo.

The reference is the caller channel, the degraded signal the agent channel shifted back by
the echo's delay (found by cross-correlation, `agent.testing.testsignal.measure_echo`), both
resampled to 8 kHz (narrowband P.862, for G.711 paths) or 16 kHz (wideband P.862.2, for Opus).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent.testing.testsignal import decimate, measure_echo

NARROWBAND_CODECS = frozenset({"pcmu", "pcma", "g711", "l16-8k"})
MAX_SECONDS = 30.0  # P.862 is meant for short samples; longer calls are scored on their start


@dataclass
class Quality:
    score: float | None
    mode: str  # "nb" or "wb"
    delay_ms: float | None = None
    error: str | None = None


def mode_for(codec: str | None, transport: str) -> str:
    """Narrowband for G.711 and the phone transports' defaults, wideband otherwise."""
    if codec is not None:
        return "nb" if codec.lower() in NARROWBAND_CODECS else "wb"
    return "wb" if transport in ("webrtc", "realtime") else "nb"


def score(caller: np.ndarray, agent: np.ndarray, rate: int, mode: str) -> Quality:
    """PESQ of `agent` (the echo) against `caller` (what was sent), both on one timeline."""
    target = 8000 if mode == "nb" else 16000
    limit = int(MAX_SECONDS * rate)
    sent, back = caller[:limit], agent
    if not np.any(sent) or not np.any(back):
        return Quality(None, mode, error="no audio to compare")
    echo = measure_echo(sent, back, rate, skip_seconds=0.0)
    lag = int(round(echo.lag_seconds * rate))
    back = back[lag : lag + len(sent)]
    if len(back) < len(sent):
        back = np.concatenate([back, np.zeros(len(sent) - len(back), dtype=np.float32)])
    ref = decimate(sent, rate, target).astype(np.float32)
    deg = decimate(back, rate, target).astype(np.float32)
    import pesq as pesq_lib  # the peer extra: imported only when a call is scored

    try:
        value = float(pesq_lib.pesq(target, ref, deg, mode))
    except pesq_lib.PesqError as exc:
        return Quality(None, mode, round(echo.lag_seconds * 1000, 1),
                       error=f"{type(exc).__name__}: {exc}".strip(": "))
    return Quality(round(value, 3), mode, round(echo.lag_seconds * 1000, 1))
