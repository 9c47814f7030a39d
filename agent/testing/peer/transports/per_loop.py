"""One object per running event loop, made on first use: the peer's shared tick and its
socket polls serve every call of a loop, and a process that runs several loops one after
another (`asyncio.run` per test or per load level) gets a fresh one in each, gone with its
loop."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary())

    def __call__(self) -> T:
        """The running loop's one object."""
        loop = asyncio.get_running_loop()
        made = self._made.get(loop)
        if made is None:
            made = self._made[loop] = self._make()
        return made
