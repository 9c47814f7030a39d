"""The prose names what is there: every repository path a docstring of agent/ or signaling/,
a page of docs/ or README.md names exists, and docs/architecture.md maps every module.

Pure reading of files (`ast` for the docstrings): nothing is imported or run."""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "signaling")
TOP = "agent|signaling|tests|benchmarks|docs|examples|deploy|scripts|web"
# A path from one of the repository's top folders; not part of a URL or a longer path.
PATH = re.compile(rf"(?<![\w./:@~$-])((?:{TOP})/[\w./*{{}}<>-]*[\w/*])")
# A file named without its folder: some file of the repository must have that name.
BARE = re.compile(r"(?<![\w./*<{-])(\w+\.py)\b")
# Paths named on purpose that are not in this repository, with why.
NOT_HERE = {
    "tests/voice/booking.yaml": "a user's own script in the CI recipe of docs/testing.md",
    "signaling/web/": "where the wheel carries web/ (pyproject.toml's package data)",
}
SKIPPED_DIRS = {".git", ".venv", "node_modules", "__pycache__", "build", "dist"}


def module_files() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def docstrings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text


def prose() -> Iterator[tuple[str, str]]:
    """(where, text) for every docstring of the packages, every docs page and the README."""
    for path in module_files():
        for text in docstrings(path):
            yield str(path.relative_to(ROOT)), text
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


@functools.cache
def file_names() -> frozenset[str]:
    names: set[str] = set()
    for _folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")
                   and not d.endswith(".egg-info")]
        names.update(files)
    return frozenset(names)


def path_exists(named: str) -> bool:
    named = named.rstrip(".")
    if named in NOT_HERE or "{" in named or "<" in named:
        return True
    if "*" in named:
        return any(ROOT.glob(named))
    if (ROOT / named).exists():
        return True
    # `signaling/workers/tally.SharedTally`: a module and a name in it
    folder, _, last = named.rpartition("/")
    module = last.split(".", 1)[0]
    return bool(module) and (ROOT / folder / f"{module}.py").exists()


def stale_references() -> list[str]:
    found = []
    for where, text in prose():
        for match in PATH.finditer(text):
            if not path_exists(match.group(1)):
                found.append(f"{where}: {match.group(1)}")
        for match in BARE.finditer(text):
            if match.group(1) not in file_names():
                found.append(f"{where}: {match.group(1)}")
    return found


def test_every_path_the_prose_names_exists() -> None:
    found = stale_references()
    assert not found, "named but not in the repository:\n" + "\n".join(found)


def test_the_path_check_sees_a_stale_name() -> None:
    assert path_exists("signaling/workers/tally.py")
    assert path_exists("signaling/workers/tally.SharedTally")
    assert not path_exists("signaling/worker_tally.py")
    assert not path_exists("signaling/worker_tally.SharedTally")
    assert "worker_tally.py" not in file_names() and "tally.py" in file_names()
    assert PATH.findall("see https://example.com/docs/x.md and docs/sip.md") == ["docs/sip.md"]


def architecture_rows(text: str) -> dict[str, str]:
    """docs/architecture.md's map: a table row per folder (`agent/webrtc/`) -> its text."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"\| `([\w/]+/)`[^|]*\|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def unmapped_modules() -> list[str]:
    """Modules docs/architecture.md does not name: by path, dotted name, or file name in the
    row of its folder."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = architecture_rows(text)
    missing = []
    for path in module_files():
        if path.name == "__init__.py":
            continue
        relative = path.relative_to(ROOT).as_posix()
        dotted = relative.removesuffix(".py").replace("/", ".")
        row = rows.get(path.parent.relative_to(ROOT).as_posix() + "/", "")
        in_row = re.search(rf"(?<![\w/.]){re.escape(path.name)}", row)
        if relative not in text and not re.search(rf"{re.escape(dotted)}\b", text) \
                and not in_row:
            missing.append(relative)
    return missing


def test_architecture_maps_every_module() -> None:
    missing = unmapped_modules()
    assert not missing, ("docs/architecture.md does not name (add each to its folder's row): "
                         + ", ".join(missing))
