"""agent/telephony: plain RTP legs, media-stream websockets, G.711, DTMF."""
