"""PCM as every transport sends it: 20 ms packets, float samples to signed 16-bit."""

from __future__ import annotations

import numpy as np

# Every leg sends 20 ms per packet or message (WebRTC, the media stream, RTP; RTP takes any
# packet duration in).
PTIME = 0.02


def float_to_s16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
