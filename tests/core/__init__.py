"""agent/ top level: ticker, leg registry, recording, watchdog, metrics, the peer and offline
CLIs, plugin flags."""
