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
        self._held = held

    def publish(self) -> None:
        SLOT.pack_into(self._map, self.index * SLOT.size, self._held() + self.arriving)

    def loads(self) -> list[int]:
        return [SLOT.unpack_from(self._map, i * SLOT.size)[0] for i in range(self.count)]

    def lighter_worker(self) -> int | None:
        """The least loaded other worker, where it holds `MARGIN` fewer calls than this one."""
        loads = [held + handed for held, handed in zip(self.loads(), self.handing)]
        lightest = min((i for i in range(self.count) if i != self.index),
                       key=loads.__getitem__, default=None)
        if lightest is None or loads[lightest] + MARGIN > loads[self.index]:
            return None
        return lightest

    def close(self) -> None:
        self._map.close()
