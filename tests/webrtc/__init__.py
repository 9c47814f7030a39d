"""agent/webrtc and agent/rtc_tuning: calls from real aiortc peers, encoding, /offer, TURN, SCTP."""
