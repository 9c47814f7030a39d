"""The agent audio waiting between the ticker (80 ms in) and the pacer (20 ms out)."""

from __future__ import annotations

from .sample_fifo import SampleFifo


class PlayoutBuffer(SampleFifo):
    """A SampleFifo of agent output; `clear()` on barge-in drops what was not played yet."""
