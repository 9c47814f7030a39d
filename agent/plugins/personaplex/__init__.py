"""The PersonaPlex model package: the Moshi architecture (Mimi codec, LM), batched for the ticker.

Imports no transport, protocol or signaling module (an import-linter contract in
pyproject.toml); its plugin reaches the core only through `agent/plugins/base.py`.
"""
