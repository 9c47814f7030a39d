"""A node's tag claimed at start-up (signaling/cluster/claim.py) when Redis cannot answer:
nobody listening on the URL, or a redis-server paused with SIGSTOP (it accepts connections
and never replies). Either way the start-up ends within its bound with the coded line
`cluster_unreachable`, never a hang or a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from signaling.cluster import claim
from signaling.cluster.claim import ClaimError, claim_tag
from signaling.cluster.settings import ClusterSettings
from tests.cluster.support import REPO, SECRET, Redis, free_port

SHORT_S = 1.0  # the connect bound for the in-process tests (the real one is 10 s)


def settings(url: str) -> ClusterSettings:
    return ClusterSettings(url, "http://127.0.0.2:8080", SECRET.encode())


@pytest.fixture
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claim, "CONNECT_TRIES_S", SHORT_S)
    monkeypatch.delenv(claim.TAG_ENV, raising=False)


@pytest.fixture
def paused_redis(tmp_path: Path) -> Iterator[Redis]:
    server = Redis(tmp_path / "redis")
    server.start()
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def test_nobody_listening_is_cluster_unreachable(short_bound: None) -> None:
    started = time.monotonic()
    with pytest.raises(ClaimError) as refused:
        claim_tag(settings(f"redis://127.0.0.1:{free_port()}/0"))
    assert refused.value.code == "cluster_unreachable"
    assert "cannot reach Redis" in str(refused.value)
    # one more try may begin just before the bound: 2 s of connect timeout at most
    assert time.monotonic() - started < SHORT_S + 2.0 + 3.0


@pytest.mark.interop  # a real redis-server
def test_a_paused_redis_is_cluster_unreachable(short_bound: None, paused_redis: Redis) -> None:
    started = time.monotonic()
    with pytest.raises(ClaimError) as refused:
        claim_tag(settings(paused_redis.url))
    assert refused.value.code == "cluster_unreachable"
    # a try that started before the bound waits out its 2 s socket timeout, no more
    assert time.monotonic() - started < SHORT_S + 2.0 + 3.0
    assert claim.TAG_ENV not in os.environ  # nothing claimed


@pytest.mark.slow  # the real 10 s bound
def test_the_server_exits_with_a_coded_line() -> None:
    """`python -m signaling --cluster` on a URL nobody listens on: exit status 2 and one
    `error [cluster_unreachable]` line within the 10 s bound (and its last 2 s try)."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != claim.TAG_ENV}
    started = time.monotonic()
    finished = subprocess.run(
        [sys.executable, "-m", "signaling", "--host", "127.0.0.2", "--port", str(free_port()),
         "--cluster", f"redis://127.0.0.1:{port}/0", "--node-address",
         "http://127.0.0.2:8080"],
        cwd=REPO, env={**env, "AGENT_CLUSTER_SECRET": SECRET}, capture_output=True,
        timeout=claim.CONNECT_TRIES_S + 40)
    took = time.monotonic() - started
    stderr = finished.stderr.decode(errors="replace")
    assert finished.returncode == 2, stderr
    assert "error [cluster_unreachable]: --cluster: cannot reach Redis" in stderr, stderr
    assert "Traceback" not in stderr
    assert claim.CONNECT_TRIES_S <= took < claim.CONNECT_TRIES_S + 2.0 + 20.0, took
