"""signaling/worker_load.py: the calls each worker holds, shared through a mapped file."""

from __future__ import annotations

from pathlib import Path

from signaling.worker_load import MARGIN, WorkerLoads


def test_each_worker_sees_the_others_counts_and_hands_calls_to_a_lighter_one(
        tmp_path: Path) -> None:
    held = [MARGIN - 1, 0]
    first = WorkerLoads(tmp_path, 0, 2, held=lambda: held[0])
    second = WorkerLoads(tmp_path, 1, 2, held=lambda: held[1])
    try:
        first.publish()
        second.publish()
        assert first.loads() == second.loads() == [MARGIN - 1, 0]
        assert first.lighter_worker() is None  # not worth a hop
        held[0] = MARGIN
        first.publish()
        assert first.lighter_worker() == 1
        assert second.lighter_worker() is None  # the lighter one keeps its calls

        first.handing[1] += 1  # on its way there: counted before it arrives
        assert first.lighter_worker() is None
        first.handing[1] -= 1

        first.arriving += 1  # being set up here counts too
        held[0] = MARGIN - 1
        first.publish()
        assert second.loads()[0] == MARGIN
    finally:
        first.close()
        second.close()


def test_a_lone_worker_never_hands_a_call_on(tmp_path: Path) -> None:
    only = WorkerLoads(tmp_path, 0, 1, held=lambda: 100)
    try:
        only.publish()
        assert only.lighter_worker() is None
    finally:
        only.close()
