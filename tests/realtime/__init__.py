"""agent/realtime and the /v1/realtime/calls API."""
