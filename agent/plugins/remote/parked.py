"""Engine sessions opened while an offer is answered, waiting for their call to claim them.

The event loop parks a link under a random token (carried in the call's RuntimeConfig) and
the ticker thread claims it in `create_session`; whichever comes first of a claim, a discard
or the claim timeout takes it out, exactly once.
"""

from __future__ import annotations

import secrets
import threading

from agent.plugins.remote.link import UpstreamLink


class ParkedLinks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[str, UpstreamLink] = {}

    def park(self, link: UpstreamLink) -> str:
        token = secrets.token_urlsafe(12)
        with self._lock:
            self._links[token] = link
        return token

    def claim(self, token: object) -> UpstreamLink | None:
        """The link parked under `token`, taken out; None if gone or never parked."""
        if not isinstance(token, str):
            return None
        with self._lock:
            return self._links.pop(token, None)

    def take_all(self) -> list[UpstreamLink]:
        with self._lock:
            links, self._links = list(self._links.values()), {}
        return links
