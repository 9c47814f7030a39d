"""Flag types of the SIP flags: a number within a range, seconds within a range, a whole number
from a minimum. Each refuses what is out of range (NaN included: it compares false) with one
line that says what was expected."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _shown(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def between(low: float, high: float, unit: str = "") -> Callable[[str], float]:
    """A flag type: a number from `low` to `high` (`unit` follows them in the error)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = low - 1.0
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"expected {_shown(low)} to {_shown(high)}{unit}, not {text!r}")
        return value
    return parse


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """A flag type: a number of seconds from `low` to `high`."""
    return between(low, high, " seconds")


def whole_from(low: int, high: int = 10_000_000) -> Callable[[str], int]:
    """A flag type: a whole number from `low` (to `high`)."""
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low}, not {text!r}")
        return int(text)
    return parse
