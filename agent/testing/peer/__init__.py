"""The headless test peer: calls an agent on any of its transports, plays audio, records what
comes back, measures it and checks it.

- `transports/`: one `PeerCall` per transport (`base.py` is the contract; `open_call` picks
  one by name: webrtc, realtime, media-stream, rtp, sip);
- `recording.py`: one direction's audio with arrival times on the call's t0 timeline;
- `measure.py`: transport-level measurements of a finished call;
- `report.py`: `CallReport` and `CheckResult`;
- `wav.py`: WAV in and out; `cli.py`: `python -m agent.peer`.

The names the tests and benchmarks import from `agent.testing.peer` are re-exported here.
"""

from agent.testing.peer.cli import event_counts, main
from agent.testing.peer.recording import PEER_RATE, Recording
from agent.testing.peer.report import CallReport, CheckResult
from agent.testing.peer.transports.base import (
    PeerCall,
    PeerError,
    PeerOptions,
    TimedEvent,
    open_call,
)
from agent.testing.peer.transports.webrtc import (
    PreencodedSignalTrack,
    SignalTrack,
    post_offer,
    run_call,
)
from agent.testing.peer.wav import load_wav, save_wav

__all__ = [
    "PEER_RATE",
    "CallReport",
    "CheckResult",
    "PeerCall",
    "PeerError",
    "PeerOptions",
    "PreencodedSignalTrack",
    "Recording",
    "SignalTrack",
    "TimedEvent",
    "event_counts",
    "load_wav",
    "main",
    "open_call",
    "post_offer",
    "run_call",
    "save_wav",
]
