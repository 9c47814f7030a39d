"""`python -m agent.peer URL`: the headless WebRTC caller (agent/testing/peer.py)."""

from __future__ import annotations

import sys

from agent.testing.peer import main

if __name__ == "__main__":
    sys.exit(main())
