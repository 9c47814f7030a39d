"""How many calls each worker holds, so a new call goes to the least loaded one.

Which worker accepts a connection is the kernel's choice, and it is far from even: one
HTTP client opening 200 RTP legs put 131 on one worker and 69 on the other, so one core
ran out while the other idled. Each worker publishes its count (calls held plus new calls
being set up) in its slot of a small file in the private worker folder, mapped by every
worker; reading the others' counts is a few memory loads, no request. A worker that holds
`MARGIN` or more calls than the least loaded one hands a new call to it.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

SLOT = struct.Struct("<q")
MARGIN = 2  # calls: a smaller difference is not worth a hop over the worker socket
FILE_NAME = "loads"


class WorkerLoads:
    """`held`: the calls this worker holds now (live, and admitted while being set up)."""

    def __init__(self, folder: Path, index: int, count: int, held: Callable[[], int]) -> None:
        self.index = index
        self.count = count
        size = SLOT.size * count
        descriptor = os.open(folder / FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(descriptor).st_size < size:
                os.ftruncate(descriptor, size)  # every worker asks for the same size
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self.arriving = 0  # new calls being set up here, not yet held
        # new calls handed to each worker and not yet answered: its slot counts them only
        # once they arrive there, and a burst would otherwise all go to the same one
        self.handing = [0] * count
        # connections handed to each worker (worker_handoff.py), which no answer confirms:
        # (the count its slot must reach to include it, until when to count it here)
        self._handed: list[list[tuple[int, float]]] = [[] for _ in range(count)]
        self._held = held

    def publish(self) -> None:
        SLOT.pack_into(self._map, self.index * SLOT.size, self._held() + self.arriving)

    def loads(self) -> list[int]:
        return [SLOT.unpack_from(self._map, i * SLOT.size)[0] for i in range(self.count)]

    def handed_over(self, index: int, count_for_s: float) -> None:
        """A connection was handed to worker `index`: count it against that worker until its
        own slot includes it, or for `count_for_s` at most (its count may fall meanwhile)."""
        waiting = self._still_handed(index, self.loads()[index])
        expected = self.loads()[index] + len(waiting) + 1
        waiting.append((expected, time.monotonic() + count_for_s))

    def _still_handed(self, index: int, slot: int) -> list[tuple[int, float]]:
        now = time.monotonic()
        waiting = [(expected, until) for expected, until in self._handed[index]
                   if expected > slot and until > now]
        self._handed[index] = waiting
        return waiting

    def lighter_worker(self) -> int | None:
        """The least loaded other worker, where it holds `MARGIN` fewer calls than this one."""
        slots = self.loads()
        loads = [slot + handing + len(self._still_handed(i, slot))
                 for i, (slot, handing) in enumerate(zip(slots, self.handing))]
        lightest = min((i for i in range(self.count) if i != self.index),
                       key=loads.__getitem__, default=None)
        if lightest is None or loads[lightest] + MARGIN > loads[self.index]:
            return None
        return lightest

    def close(self) -> None:
        self._map.close()
