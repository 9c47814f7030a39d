"""Counts every worker shares, so a limit the operator sets holds for the whole server.

With `--workers N` each worker admits calls, accepts connections and mints secrets on its
own; a limit counted per worker would let the server hold N times as much. A `SharedTally`
is a small file in the private worker folder, mapped by every worker: one row per worker of
(key, count) slots, each row written by its worker only. A key is a 64-bit hash of what is
counted (an address, a tenant, "calls"). `take` decides and counts in one step under an
exclusive lock on the file (`flock`: a few microseconds, never held across an await), so
two workers cannot both take the last unit. A restarted worker starts its row empty: what
its predecessor held died with it.

Why our own: the counts live for one server start, between processes of one host; a
database or Redis would add a process for what a mapped file and a lock do here. (Several
hosts share limits through `--cluster`, not this.)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

KEY_BYTES = 8


def key_of(text: str) -> int:
    """The 64-bit key of `text` (never 0, which marks a free slot)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogateescape"),
                             digest_size=KEY_BYTES).digest()
    return int.from_bytes(digest, "little") or 1


class SharedTally:
    def __init__(self, path: Path, index: int, count: int, slots: int) -> None:
        self.index = index
        self.slots = slots
        size = 2 * count * slots * KEY_BYTES
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < size:
            os.ftruncate(self._fd, size)  # every worker asks for the same size
        self._map = mmap.mmap(self._fd, size)
        half = count * slots
        self._keys = np.frombuffer(self._map, dtype=np.uint64, count=half).reshape(count, slots)
        self._counts = np.frombuffer(self._map, dtype=np.int64, count=half,
                                     offset=half * KEY_BYTES).reshape(count, slots)
        with self._locked():
            self._keys[index] = 0
            self._counts[index] = 0

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _slot(self, key: int, free: bool) -> int | None:
        """This worker's slot for `key` (or, with `free`, a free one where it has none)."""
        own = self._keys[self.index]
        found = np.flatnonzero(own == np.uint64(key))
        if found.size:
            return int(found[0])
        if not free:
            return None
        empty = np.flatnonzero(own == 0)
        return int(empty[0]) if empty.size else None

    def _total(self, key: int) -> int:
        return int(self._counts[self._keys == np.uint64(key)].sum())

    def total(self, key: int) -> int:
        """What every worker together holds of `key`."""
        with self._locked():
            return self._total(key)

    def take(self, key: int, limit: int, amount: int = 1) -> bool | None:
        """Count `amount` more of `key` here if every worker together then holds at most
        `limit`: True when counted, False when that is over the limit, None when this
        worker's row has no free slot (the caller decides alone)."""
        with self._locked():
            slot = self._slot(key, free=True)
            if slot is None:
                return None
            if self._total(key) + amount > limit:
                return False
            self._set(slot, key, int(self._counts[self.index, slot]) + amount)
            return True

    def claim(self, key: int, value_here: int, limit: int) -> bool | None:
        """Hold `value_here` of `key` here if every worker together then holds at most
        `limit` (True); False when over it; None when this worker's row is full."""
        with self._locked():
            slot = self._slot(key, free=True)
            if slot is None:
                return None
            others = self._total(key) - int(self._counts[self.index, slot])
            if others + value_here > limit:
                return False
            self._set(slot, key, value_here)
            return True

    def give_back(self, key: int, amount: int = 1) -> None:
        """Count `amount` less of `key` here (never below zero)."""
        with self._locked():
            slot = self._slot(key, free=False)
            if slot is not None:
                self._set(slot, key, max(0, int(self._counts[self.index, slot]) - amount))

    def set_here(self, key: int, value: int) -> bool:
        """This worker holds `value` of `key` now (False: no free slot for it)."""
        with self._locked():
            slot = self._slot(key, free=value > 0)
            if slot is None:
                return value <= 0
            self._set(slot, key, value)
            return True

    def replace_here(self, values: Mapping[int, int]) -> None:
        """This worker's whole row, at once: exactly `values` (what does not fit is left out)."""
        kept = [(key, value) for key, value in values.items() if value > 0][:self.slots]
        with self._locked():
            self._keys[self.index] = 0
            self._counts[self.index] = 0
            if kept:
                keys, counts = zip(*kept, strict=True)
                self._keys[self.index, :len(kept)] = np.array(keys, dtype=np.uint64)
                self._counts[self.index, :len(kept)] = np.array(counts, dtype=np.int64)

    def _set(self, slot: int, key: int, value: int) -> None:
        self._counts[self.index, slot] = value
        self._keys[self.index, slot] = key if value > 0 else 0

    def close(self) -> None:
        del self._keys, self._counts
        self._map.close()
        os.close(self._fd)
