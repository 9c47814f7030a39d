"""SIP for the agent: callers reach it with a SIP INVITE instead of WebRTC or HTTP.

A small RFC 3261 user agent of our own (no SIP library on PyPI is fit: the candidates own
the RTP themselves, or, tried against sipp, turned a retransmitted INVITE into a second
call, never retransmitted their own requests and sent in-dialog requests to the wrong
place; docs/sip.md). One concept per module:

- `uri.py`: SIP URIs, name-addr values, header parameters.
- `message.py`: parse and write messages (RFC 4475-hardened), TCP framing.
- `transport.py`: UDP and TCP on `--sip-listen`.
- `timers.py`: T1/T2/T4 and the timer service (fake-able in tests).
- `transaction.py`: client and server transactions, Timers A-M.
- `dialog.py`: dialogs, route sets, in-dialog requests.
- `sdp.py`: SDP offer/answer for SIP (PCMU/PCMA, telephone-event, hold).
- `media.py`: the call's RTP leg (agent/telephony/rtp_leg.py, transport name "sip").
- `ua.py`: the user agent tying them to the media agent.
- `config.py`: flags; `service.py`: start and stop with the aiohttp app.
"""
