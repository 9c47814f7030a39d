"""The session defaults of the Moshi/PersonaPlex family: the voice and persona a call gets
when the caller names none.

Shared by the local model package (`personaplex/policy.py`) and the remote `moshi-server`
plugin (`remote/moshi_server.py`, which sends them to NVIDIA's server, as it has no defaults of
its own), so the remote plugin needs nothing from the model package.
"""

from __future__ import annotations

DEFAULT_VOICE = "NATF2.pt"
DEFAULT_PERSONA = (
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
    "engaging way."
)
