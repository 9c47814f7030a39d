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
        # each worker's count, then how many connections each worker has received from
        # each other one (worker_handoff.py): received[to][from]
        size = SLOT.size * (count + count * count)
        descriptor = os.open(folder / FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(descriptor).st_size < size:
                os.ftruncate(descriptor, size)  # every worker asks for the same size
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self.arriving = 0  # new calls being set up here, not yet held
        # new calls handed to each worker (a re-posted request, a websocket's connection) and
        # not yet received there: its slot counts them only from then, and a burst would
        # otherwise all go to the same one. (their number in what this worker has handed
        # that one, until when to count it here)
        self._handed: list[list[tuple[int, float]]] = [[] for _ in range(count)]
        # numbered on from what each has received from this one (a restarted worker too)
        self._handed_total = [self._received(i, index) for i in range(count)]
        self._held = held

    def publish(self) -> None:
        SLOT.pack_into(self._map, self.index * SLOT.size, self._held() + self.arriving)

    def loads(self) -> list[int]:
        return [SLOT.unpack_from(self._map, i * SLOT.size)[0] for i in range(self.count)]

    def _received_offset(self, to: int, source: int) -> int:
        return (self.count + to * self.count + source) * SLOT.size

    def _received(self, to: int, source: int) -> int:
        return SLOT.unpack_from(self._map, self._received_offset(to, source))[0]

    def received_from(self, source: int) -> None:
        """This worker took a call handed by worker `source` (and counts it itself from now
        on, as `arriving` until it holds it)."""
        if 0 <= source < self.count:
            offset = self._received_offset(self.index, source)
            SLOT.pack_into(self._map, offset, SLOT.unpack_from(self._map, offset)[0] + 1)

    def handed_over(self, index: int, count_for_s: float) -> None:
        """A connection was handed to worker `index`: count it against that worker until it
        has received it, or for `count_for_s` at most (it may never: a worker killed)."""
        self._handed_total[index] += 1
        self._handed[index].append((self._handed_total[index], time.monotonic() + count_for_s))

    def _still_handed(self, index: int) -> int:
        received, now = self._received(index, self.index), time.monotonic()
        waiting = [(number, until) for number, until in self._handed[index]
                   if number > received and until > now]
        self._handed[index] = waiting
        return len(waiting)

    def lighter_worker(self) -> int | None:
        """The least loaded other worker, where it holds `MARGIN` fewer calls than this one."""
        loads = [slot + self._still_handed(i) for i, slot in enumerate(self.loads())]
        lightest = min((i for i in range(self.count) if i != self.index),
                       key=loads.__getitem__, default=None)
        if lightest is None or loads[lightest] + MARGIN > loads[self.index]:
            return None
        return lightest

    def close(self) -> None:
        self._map.close()
