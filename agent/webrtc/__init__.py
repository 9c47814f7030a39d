"""The WebRTC transport: the aiortc leg, its outbound track and codecs, SDP checks and
trickle ICE."""
