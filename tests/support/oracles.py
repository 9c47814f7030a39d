"""Third-party oracles of the parity tests: skipped where missing, but a failure under CI.

CI installs every oracle (scripts/install-test-deps.sh); a parity test that silently skipped
there would stop proving anything without anyone noticing.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require(module: str) -> ModuleType:
    """Import an oracle module; skip without it, except when `CI` is set (then fail)."""
    if os.environ.get("CI"):
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(f"oracle {module} is missing under CI ({exc}); "
                        "scripts/install-test-deps.sh installs it", pytrace=False)
    return pytest.importorskip(module)
