"""A PNG per call for a person to look at: both channels' levels over time, their speech
segments, the events and the checks' marks (matplotlib's object API on its Agg canvas: no
display, and no pyplot global state, so calls analysed on several threads draw safely).

matplotlib is in the optional `peer` extra; this module is imported only for `--timeline`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from agent.testing.peer.aligned import CallAudio
from agent.testing.peer.report import CheckResult
from agent.testing.peer.transports.base import TimedEvent
from agent.testing.peer.vad import Segment

WINDOW = 0.01  # level per 10 ms
FLOOR_DB = -70.0
MAX_EVENT_LABELS = 40


def levels_db(samples: np.ndarray, rate: int) -> tuple[np.ndarray, np.ndarray]:
    """(times, dBFS) per WINDOW."""
    size = int(rate * WINDOW)
    count = len(samples) // size
    if count == 0:
        return np.zeros(0), np.zeros(0)
    frames = samples[: count * size].reshape(count, size).astype(np.float64)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    db = 20 * np.log10(np.maximum(rms, 10 ** (FLOOR_DB / 20)))
    return np.arange(count) * WINDOW, db


def render(path: str, audio: CallAudio, caller: Sequence[Segment], agent: Sequence[Segment],
           events: Sequence[TimedEvent], checks: Sequence[CheckResult], title: str = "") -> None:
    figure = Figure(figsize=(12, 6))
    FigureCanvasAgg(figure)
    axes = figure.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [3, 3, 2]})
    for axis, samples, segments, label, color in (
        (axes[0], audio.caller, caller, "caller (sent)", "tab:blue"),
        (axes[1], audio.agent, agent, "agent (received)", "tab:orange"),
    ):
        times, db = levels_db(samples, audio.rate)
        axis.plot(times, db, color=color, linewidth=0.7)
        for segment in segments:
            axis.axvspan(segment.start, segment.end, color=color, alpha=0.15)
        axis.set_ylim(FLOOR_DB, 0)
        axis.set_ylabel(f"{label}\ndBFS")
        axis.grid(alpha=0.3)
    marks = axes[2]
    marks.set_yticks([0, 1], ["events", "checks"])
    marks.set_ylim(-0.5, 1.5)
    for timed in list(events)[:MAX_EVENT_LABELS]:
        marks.plot([timed.t], [0], marker="|", color="gray", markersize=12)
        marks.annotate(str(timed.event.get("type", timed.event.get("event", "?"))),
                       (timed.t, 0), rotation=60, fontsize=6, xytext=(2, 4),
                       textcoords="offset points")
    for check in checks:
        if check.t is None:
            continue
        color = "tab:green" if check.passed else "tab:red"
        marks.plot([check.t], [1], marker="o" if check.passed else "x", color=color)
        marks.annotate(check.name, (check.t, 1), fontsize=7, color=color, xytext=(3, 3),
                       textcoords="offset points")
        for axis in axes[:2]:
            axis.axvline(check.t, color=color, linestyle="--", linewidth=0.8)
    marks.set_xlabel("seconds since the call started (t0)")
    marks.set_xlim(0, max(audio.seconds, 0.1))
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
