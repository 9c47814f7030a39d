"""How many calls each worker holds, so a new call goes to the least loaded one.

Which worker accepts a connection is the kernel's choice, and it is far from even: one
HTTP client opening 200 RTP legs put 131 on one worker and 69 on the other, so one core
ran out while the other idled. Each worker publishes its count (calls held plus new calls
being set up) in its slot of a small file in the private worker folder, mapped by every
worker; reading the others' counts is a few memory loads, no request. A worker that holds
`MARGIN` or more calls than the least loaded one hands a new call to it, and a call on its
way from one worker to another counts against the one it goes to from the moment it is
handed, whoever looks.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from pathlib import Path

SLOT = struct.Struct("<q")
TABLES = 3  # counters of calls handed between workers, below the counts:
SENT, LOST, RECEIVED = range(TABLES)
MARGIN = 2  # calls: a smaller difference is not worth a hop over the worker socket
FILE_NAME = "loads"


class WorkerLoads:
    """`held`: the calls this worker holds now (live, and admitted while being set up).

    The file holds each worker's count, then three tables of counters, each written by one
    worker only: how many new calls each worker has handed to each other one (`sent`), how
    many of those it knows never got there (`lost`: the connection failed), and how many
    each has received from each other one (`received`). A call on its way from i to j —
    `sent[i][j] - lost[i][j] - received[j][i]` — counts against j, as every worker sees:
    the one that hands it, the one it goes to, and any other.
    """

    def __init__(self, folder: Path, index: int, count: int, held: Callable[[], int]) -> None:
        self.index = index
        self.count = count
        size = SLOT.size * (count + TABLES * count * count)
        descriptor = os.open(folder / FILE_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(descriptor).st_size < size:
                os.ftruncate(descriptor, size)  # every worker asks for the same size
            self._map = mmap.mmap(descriptor, size)
        finally:
            os.close(descriptor)
        self.arriving = 0  # new calls being set up here, not yet held
        self._held = held
        # A (re)started worker has received nothing that was on its way to its predecessor.
        for source in range(count):
            self._set(RECEIVED, index, source,
                      self._get(SENT, source, index) - self._get(LOST, source, index))

    def _offset(self, table: int, row: int, column: int) -> int:
        return (self.count + (table * self.count + row) * self.count + column) * SLOT.size

    def _get(self, table: int, row: int, column: int) -> int:
        return SLOT.unpack_from(self._map, self._offset(table, row, column))[0]

    def _set(self, table: int, row: int, column: int, value: int) -> None:
        SLOT.pack_into(self._map, self._offset(table, row, column), value)

    def _add_one(self, table: int, other: int) -> None:
        if 0 <= other < self.count:
            self._set(table, self.index, other, self._get(table, self.index, other) + 1)

    def publish(self) -> None:
        SLOT.pack_into(self._map, self.index * SLOT.size, self._held() + self.arriving)

    def loads(self) -> list[int]:
        """Each worker's calls: held, being set up there, and on their way to it."""
        return [SLOT.unpack_from(self._map, to * SLOT.size)[0]
                + sum(self._on_the_way(source, to) for source in range(self.count))
                for to in range(self.count)]

    def _on_the_way(self, source: int, to: int) -> int:
        return max(0, self._get(SENT, source, to) - self._get(LOST, source, to)
                   - self._get(RECEIVED, to, source))

    def handed_over(self, index: int) -> None:
        """A new call is on its way to worker `index` (it counts there until received)."""
        self._add_one(SENT, index)

    def lost_on_the_way(self, index: int) -> None:
        """A call handed to worker `index` never reached it (its connection failed)."""
        self._add_one(LOST, index)

    def received_from(self, source: int) -> None:
        """This worker took a call handed by worker `source` (and counts it itself from now
        on, as `arriving` until it holds it)."""
        self._add_one(RECEIVED, source)

    def lighter_worker(self) -> int | None:
        """The least loaded other worker, where it holds `MARGIN` fewer calls than this one."""
        loads = self.loads()
        lightest = min((i for i in range(self.count) if i != self.index),
                       key=loads.__getitem__, default=None)
        if lightest is None or loads[lightest] + MARGIN > loads[self.index]:
            return None
        return lightest

    def close(self) -> None:
        self._map.close()
