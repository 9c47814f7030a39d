"""signaling/workers/load.py: the calls each worker holds, shared through a mapped file."""

from __future__ import annotations

from pathlib import Path

from signaling.workers.load import MARGIN, WorkerLoads


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

        first.handed_over(1)  # on its way there: counted before it arrives
        assert first.lighter_worker() is None
        second.received_from(0)
        assert first.lighter_worker() == 1

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


def test_a_call_on_its_way_counts_against_the_worker_it_goes_to_for_everyone(
        tmp_path: Path) -> None:
    """No answer says a handed websocket arrived: a call handed from one worker to another
    counts against the one it goes to until that one has received it (and counts it itself),
    as every worker sees it; one whose connection failed stops counting; a restarted worker
    has received nothing that was on its way to its predecessor."""
    held = [MARGIN + 1, 0, 0]
    workers = [WorkerLoads(tmp_path, i, 3, held=lambda i=i: held[i]) for i in range(3)]
    first, second, third = workers
    try:
        for worker in workers:
            worker.publish()
        assert first.lighter_worker() in (1, 2)
        first.handed_over(1)
        first.handed_over(1)  # a burst: each counted on top of the last
        assert [w.loads() for w in workers] == [[MARGIN + 1, 2, 0]] * 3
        second.arriving += 1  # the first one arrived and counts there (as worker_handoff does)
        second.publish()
        second.received_from(0)
        assert third.loads() == [MARGIN + 1, 2, 0]  # once, not twice
        third.handed_over(1)  # from another worker at the same time: the first sees it too
        assert first.loads() == [MARGIN + 1, 3, 0]
        third.lost_on_the_way(1)  # its connection failed: it never got there
        assert first.loads() == [MARGIN + 1, 2, 0]

        again = WorkerLoads(tmp_path, 1, 3, held=lambda: 0)  # worker 1 restarted, the second
        try:                                                  # call lost with its predecessor
            again.publish()
            assert first.loads() == [MARGIN + 1, 0, 0]
            first.handed_over(1)
            assert third.loads() == [MARGIN + 1, 1, 0]
            again.received_from(0)
            assert third.loads() == [MARGIN + 1, 0, 0]
        finally:
            again.close()
    finally:
        for worker in workers:
            worker.close()
