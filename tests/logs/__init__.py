"""agent/logs: JSON log lines, redaction, throttling."""
