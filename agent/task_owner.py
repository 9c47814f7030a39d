"""Tasks with an owner: a call or leg starts its tasks here and cancels them all when it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class TaskOwner:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        """Start a task this owner will cancel; it forgets the task once it is done."""
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_all(self) -> list[asyncio.Task[Any]]:
        """Cancel every task but the one running this (it is finishing the close itself)."""
        current = asyncio.current_task()
        cancelled = [task for task in self._tasks if task is not current]
        for task in cancelled:
            task.cancel()
        return cancelled

    def __len__(self) -> int:
        return len(self._tasks)
