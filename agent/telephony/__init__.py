"""Phone-network legs that feed the same plugin sessions as WebRTC calls.

`media_stream`: the Twilio-style media-stream websocket (JSON + base64 μ-law).
`rtp_leg`: plain RTP to and from an address a PBX gives (Asterisk External Media).
Both build on `leg.TelephonyLeg`; G.711 lives in `g711`, codec descriptions in `codec`.
"""
