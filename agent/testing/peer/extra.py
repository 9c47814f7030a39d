"""The peer's optional dependencies (the `peer` extra in pyproject.toml): which features need
them, and the one line that refuses such a feature, before dialling, when they are missing.

A plain call (the test signal or a WAV, the echo's delay, gaps, jitter) needs nothing beyond
the package. Scripts (YAML, JSON Schema, the speech detector), PESQ, the PNG timeline and a
load run's progress bar come with the extra. Without it a plain call still runs and reports;
it leaves out the speech segments, turn latencies and PESQ (`pesq_error` says why), and a
load run shows no progress bar.
"""

from __future__ import annotations

import argparse
import functools
import importlib

from agent.cli_errors import CliError

INSTALL = "pip install -e '.[peer]'"  # from a clone of the repository

# A feature (as the command line names it) and the modules it imports.
NEEDS: dict[str, tuple[str, ...]] = {
    "--script": ("yaml", "jsonschema", "webrtcvad"),
    "--timeline": ("matplotlib", "webrtcvad"),
    "--pesq": ("pesq", "webrtcvad"),
    "--min-pesq": ("pesq", "webrtcvad"),
}
SPEECH = "webrtcvad"  # the speech detector behind speech segments, latencies and PESQ
PROGRESS = "tqdm"


@functools.cache
def installed(module: str) -> bool:
    """Whether `module` imports (a broken install counts as missing)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing(feature: str) -> str:
    return f"{feature} needs the peer extra: {INSTALL}"


def require(feature: str) -> None:
    """A `missing_extra` CliError unless every module `feature` needs is installed."""
    if not all(installed(module) for module in NEEDS[feature]):
        raise CliError("missing_extra", missing(feature))


def require_for(args: argparse.Namespace) -> None:
    """Each feature the command line asks for whose extra is missing: refused in one line."""
    if args.script:
        require("--script")
    if args.timeline:
        require("--timeline")
    if args.min_pesq is not None:
        require("--min-pesq")
    if args.pesq in ("nb", "wb"):
        require("--pesq")
