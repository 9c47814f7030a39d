"""agent/audio: framing, resampling, FIFOs, playout and pacing."""
