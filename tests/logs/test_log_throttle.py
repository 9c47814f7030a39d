"""LogThrottle: one line per interval per source, with a count of what it held back."""

from __future__ import annotations

import pytest

from agent.logs.log_safe import LogThrottle, held_back_note
from tests.support.clock import FakeClock


def test_first_line_passes_then_one_per_interval_with_the_count_held_back() -> None:
    clock = FakeClock()
    throttle = LogThrottle(1.0, clock)
    assert throttle.admit() == 0  # the first line is written, nothing was held back
    assert [throttle.admit() for _ in range(500)] == [None] * 500
    clock.advance(0.999)
    assert throttle.admit() is None
    clock.advance(0.001)
    assert throttle.admit() == 501  # the next line says how many were not logged
    assert throttle.admit() is None
    assert throttle.take_held_back() == 1  # the summary at the end takes the rest
    assert throttle.take_held_back() == 0


def test_a_quiet_source_logs_every_line() -> None:
    clock = FakeClock()
    throttle = LogThrottle(1.0, clock)
    for _ in range(5):
        assert throttle.admit() == 0
        clock.advance(1.5)
    assert throttle.take_held_back() == 0


def test_a_flood_of_ten_minutes_at_a_thousand_a_second_costs_one_line_a_second() -> None:
    clock = FakeClock()
    throttle = LogThrottle(1.0, clock)
    written, reported = 0, 0
    for _ in range(600 * 1000):
        held = throttle.admit()
        if held is not None:
            written += 1
            reported += held
        clock.advance(0.001)
    reported += throttle.take_held_back()
    assert 599 <= written <= 601
    assert written + reported == 600 * 1000  # nothing lost from the count


def test_note_and_bad_interval() -> None:
    assert held_back_note(0) == ""
    assert held_back_note(3, "malformed messages") == \
        " (3 more malformed messages not logged since the last line)"
    with pytest.raises(ValueError):
        LogThrottle(0)
