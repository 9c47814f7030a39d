"""README.md stays short enough to read in one sitting: it speaks to users with one current
figure per claim, and detail lives in docs/ (the history of every measurement in
docs/benchmarks.md). Pure reading of the file."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 200


def test_the_readme_has_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_LINES}): move detail to the docs/ page "
        "it belongs in, and measurements' history to docs/benchmarks.md")
