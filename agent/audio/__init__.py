"""The audio path shared by every transport: framing and resampling to the plugin's rate,
the caller FIFO, the agent's playout and its pacing clock."""
