"""signaling/worker_load.py: the calls each worker holds, shared through a mapped file."""

from __future__ import annotations

from pathlib import Path

from signaling.worker_load import MARGIN, WorkerLoads


def test_each_worker_sees_the_others_counts_and_hands_calls_to_a_lighter_one(
        tmp_path: Path) -> None:
    first, second = WorkerLoads(tmp_path, 0, 2), WorkerLoads(tmp_path, 1, 2)
    try:
        first.publish(MARGIN - 1)
        second.publish(0)
        assert first.loads() == second.loads() == [MARGIN - 1, 0]
        assert first.lighter_worker() is None  # not worth a hop
        first.publish(MARGIN)
        assert first.lighter_worker() == 1
        assert second.lighter_worker() is None  # the lighter one keeps its calls

        first.handing[1] += 1  # on its way there: counted before it arrives
        assert first.lighter_worker() is None
        first.handing[1] -= 1

        first.arriving += 1  # being set up here counts too
        first.publish(MARGIN - 1)
        assert second.loads()[0] == MARGIN
    finally:
        first.close()
        second.close()


def test_a_lone_worker_never_hands_a_call_on(tmp_path: Path) -> None:
    only = WorkerLoads(tmp_path, 0, 1)
    try:
        only.publish(100)
        assert only.lighter_worker() is None
    finally:
        only.close()
