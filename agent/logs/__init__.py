"""Logging that is safe with client input: printable text, redaction of secrets, the JSON log
format."""
