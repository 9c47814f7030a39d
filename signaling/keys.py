"""Typed keys for objects stored on the aiohttp application."""

from __future__ import annotations

from aiohttp import web

from agent.media_agent import MediaAgent

AGENT_KEY = web.AppKey("agent", MediaAgent)
