"""The PNG timeline of a call (agent/testing/peer/timeline.py): a real image of both
channels with segments, events and check marks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from agent.testing.peer.aligned import CallAudio
from agent.testing.peer.report import CheckResult
from agent.testing.peer.timeline import levels_db, render
from agent.testing.peer.transports.base import TimedEvent
from agent.testing.peer.vad import Segment
from tests.peer.speech import RATE, bursts


def test_a_timeline_png_is_drawn(tmp_path: Path) -> None:
    audio = CallAudio(RATE, bursts([(0.2, 1.0)], 3.0), bursts([(1.1, 1.9)], 3.0))
    path = tmp_path / "call.png"
    render(str(path), audio, [Segment(0.2, 1.0)], [Segment(1.1, 1.9)],
           [TimedEvent(0.05, {"type": "session.created"})],
           [CheckResult("02_expect_speech", True, 0.1, 1.5, "s", t=1.1),
            CheckResult("03_barge_in", False, None, 400, "ms", t=2.0)], title="call-001")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (1200, 600)
        pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    # Drawn, not blank: several colours (levels, spans, marks).
    assert len(np.unique(pixels, axis=0)) > 20


def test_levels_are_dbfs_per_10_ms() -> None:
    times, db = levels_db(np.full(RATE, 0.5, dtype=np.float32), RATE)
    assert len(times) == 100 and np.allclose(db, 20 * np.log10(0.5))
    _, quiet = levels_db(np.zeros(RATE, dtype=np.float32), RATE)
    assert np.all(quiet == -70.0)
