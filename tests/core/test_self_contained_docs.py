"""The repository's files point at nothing outside it: no document, docstring or comment sends
a reader to a sibling folder that a clone does not have (a `shared` folder of reference notes
beside the checkout, say)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ["../" + "shared", "shared/" + "docs", "SIP" + ".md"]


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return [ROOT / name for name in listed if name]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in [*tracked_files(), ROOT / "examples" / "baresip" / "config"]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if any(mark in line for mark in OUTSIDE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_baresip_recipe_copies_the_files_the_tests_use() -> None:
    recipe = (ROOT / "docs" / "sip.md").read_text(encoding="utf-8")
    assert "cp examples/baresip/config examples/baresip/accounts" in recipe
    config = (ROOT / "examples" / "baresip" / "config").read_text(encoding="utf-8")
    assert "module_path\t\t/usr/lib/baresip/modules" in config
    tests = (ROOT / "tests" / "sip" / "test_sip_baresip.py").read_text(encoding="utf-8")
    assert '"examples" / "baresip"' in tests
