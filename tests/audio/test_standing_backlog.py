from __future__ import annotations

from agent.audio.standing_backlog import StandingBacklog


def test_the_smallest_wait_of_a_window_is_dropped_in_granules() -> None:
    backlog = StandingBacklog(window=4, hold=8, granule=10, cushion=40)
    assert [backlog.observe(w) for w in (35, 57, 41, 90)] == [0, 0, 0, 30]
    # A new window starts from nothing.
    assert [backlog.observe(w) for w in (9, 50, 50, 50)] == [0, 0, 0, 0]


def test_lateness_keeps_a_bounded_cushion_for_the_hold() -> None:
    backlog = StandingBacklog(window=4, hold=12, granule=10, cushion=40)
    backlog.lateness_seen()
    assert backlog.holding
    assert [backlog.observe(95) for _ in range(4)] == [0, 0, 0, 50]  # 95 - 40, in granules
    assert [backlog.observe(45) for _ in range(4)] == [0, 0, 0, 0]  # within the cushion
    assert [backlog.observe(45) for _ in range(4)] == [0, 0, 0, 40]  # the hold is over
    assert not backlog.holding


def test_restarting_the_window_forgets_what_was_seen() -> None:
    backlog = StandingBacklog(window=3, hold=0, granule=1, cushion=0)
    backlog.observe(5)
    backlog.observe(5)
    backlog.restart_window()
    assert [backlog.observe(7) for _ in range(3)] == [0, 0, 7]
