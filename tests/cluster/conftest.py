"""Fixtures the cluster tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.support import Redis


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    """A real redis-server on a free loopback port, stopped by its PID after the test."""
    server = Redis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()
