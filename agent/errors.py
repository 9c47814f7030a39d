"""Errors as data: every refusal the agent makes carries a machine-readable code."""

from __future__ import annotations

from .plugins.base import PluginError


class CallError(PluginError):
    """A call could not be set up (bad offer, server full, ...)."""
