"""`python -m agent.peer URL`: the headless test peer (agent/testing/peer/cli.py)."""

from __future__ import annotations

import sys

from agent.testing.peer import main

if __name__ == "__main__":
    sys.exit(main())
