"""The rules that end a leg on its own, on explicit monotonic times."""

from __future__ import annotations

from agent.call_settings import CallSettings
from agent.watchdog import Watchdog

SETTINGS = CallSettings(connect_timeout=20.0, idle_timeout=15.0, max_call_seconds=60.0)


def test_a_leg_that_never_connects_ends_after_the_connect_timeout() -> None:
    watchdog = Watchdog(SETTINGS, now=100.0)
    assert watchdog.verdict(119.9) is None
    assert watchdog.verdict(120.1) == "connect_timeout"


def test_a_quiet_caller_ends_after_the_idle_timeout_counted_from_the_last_audio() -> None:
    watchdog = Watchdog(SETTINGS, now=0.0)
    watchdog.media_started(now=1.0)
    assert watchdog.verdict(15.9) is None  # no audio yet: counted from connecting
    assert watchdog.verdict(16.1) == "idle_timeout"
    watchdog.heard(now=10.0)
    assert watchdog.verdict(24.9) is None
    assert watchdog.verdict(25.1) == "idle_timeout"


def test_max_call_seconds_counts_from_connecting_and_zero_means_none() -> None:
    watchdog = Watchdog(SETTINGS, now=0.0)
    watchdog.media_started(now=5.0)
    watchdog.media_started(now=30.0)  # only the first counts
    watchdog.heard(now=64.0)
    assert watchdog.verdict(64.9) is None
    assert watchdog.verdict(65.1) == "max_call_seconds"
    unlimited = Watchdog(CallSettings(max_call_seconds=0.0), now=0.0)
    unlimited.media_started(now=0.0)
    unlimited.heard(now=10_000.0)
    assert unlimited.verdict(10_001.0) is None


def test_a_media_timeout_replaces_the_connect_and_idle_timeouts() -> None:
    watchdog = Watchdog(SETTINGS, now=0.0)
    watchdog.media_timeout = 10.0
    assert watchdog.verdict(9.9) is None
    assert watchdog.verdict(10.1) == "media_timeout"  # never heard (not the 20 s connect)
    watchdog.media_started(now=5.0)
    watchdog.heard(now=5.0)
    assert watchdog.verdict(14.9) is None
    assert watchdog.verdict(15.1) == "media_timeout"  # silent 10 s (not the 15 s idle)
    watchdog.heard(now=60.0)
    assert watchdog.verdict(64.9) is None
    assert watchdog.verdict(65.1) == "max_call_seconds"  # heard lately: the call's limit
