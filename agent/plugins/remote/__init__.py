"""Plugins that run the model on a remote serving engine (vllm-omni, Moshi/PersonaPlex servers).

The agent stays the WebRTC edge; each call gets its own websocket to one engine chosen from an
`UpstreamPool`, and the ticker's `step` only hands frames over and picks up what arrived.
"""
