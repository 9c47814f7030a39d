"""The OpenAI-Realtime protocol: client events in, server events out, the session config it
carries, and the bounds on what clients send."""
