"""A send coroutine run in place, from a plain callback, without a task of its own.

aiohttp's websocket sends are coroutines (`ClientWebSocketResponse.send_str`) that almost
always finish without waiting: the frame goes into the transport's buffer and they return;
they wait only when that buffer is full (the other side stopped reading) until it drains.
The peer's paced senders run from one shared tick (send_tick.py), a plain callback for every
call; a task per send, or a task per call awaiting its sends, is the per-message wake-up the
shared tick exists to avoid. So the callback drives the coroutine itself (`send(None)`, the
step a task would take): finished at once, it cost a function call; stopped on a future (the
drain), it is kept and resumed by `ready()` on a later tick once that future is done, the
sends of that call held back meanwhile as the awaiting sender would be.

Written here because asyncio has no public way to run a coroutine eagerly before Python 3.12
(`eager_start`), and the project's interpreter is 3.11. Only for coroutines that wait on
futures alone: nothing in them may need a task of their own (`asyncio.timeout`,
`current_task`), which aiohttp's uncompressed sends do not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class InlineSend:
    """At most one send in flight: `run` starts one, `ready` says whether the last is done
    (resuming it when what it waited on is done), `error` holds what a send raised."""

    def __init__(self) -> None:
        self._coroutine: Coroutine[Any, Any, Any] | None = None
        self._waiting_on: Any = None  # what the coroutine yielded (a future, or None)
        self.error: BaseException | None = None
        self.waits = 0  # sends that could not finish at once

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> bool:
        """Start `coroutine` now (only when `ready()`); True where it finished at once
        (`error` is set where it raised)."""
        if self._coroutine is not None:
            coroutine.close()
            raise RuntimeError("a send is still waiting")
        self._coroutine = coroutine
        self._step()
        if self._coroutine is not None:
            self.waits += 1
            return False
        return True

    def ready(self) -> bool:
        """Whether no send is waiting: a waiting one goes on first once its future is done."""
        if self._coroutine is None:
            return True
        waiting_on = self._waiting_on
        if waiting_on is not None and not waiting_on.done():
            return False
        self._step()
        return self._coroutine is None

    def _step(self) -> None:
        assert self._coroutine is not None
        try:
            self._waiting_on = self._coroutine.send(None)
        except StopIteration:
            self._coroutine = self._waiting_on = None
        except (Exception, asyncio.CancelledError) as exc:  # the send failed
            self._coroutine = self._waiting_on = None
            self.error = exc

    def close(self) -> None:
        """Abandon a waiting send (the call is closing)."""
        if self._coroutine is not None:
            self._coroutine.close()
            self._coroutine = self._waiting_on = None
