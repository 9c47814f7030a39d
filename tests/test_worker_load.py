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

        first.handed_over(1, count_for_s=60)  # on its way there: counted before it arrives
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


def test_a_handed_connection_counts_against_its_worker_until_that_one_receives_it(
        tmp_path: Path) -> None:
    """No answer says a handed websocket arrived: the handing worker counts it for the other
    until the other has received it (and counts it itself), or for a while at most."""
    held = [MARGIN + 1, 0]
    first = WorkerLoads(tmp_path, 0, 2, held=lambda: held[0])
    second = WorkerLoads(tmp_path, 1, 2, held=lambda: held[1])
    try:
        first.publish()
        second.publish()
        assert first.lighter_worker() == 1
        first.handed_over(1, count_for_s=60)
        first.handed_over(1, count_for_s=60)  # a burst: each counted on top of the last
        assert first.lighter_worker() is None  # 3 against 0 + 2 on their way
        second.arriving += 1  # the first one arrived and counts there (as worker_handoff does)
        second.publish()
        second.received_from(0)
        held[1] = 1
        second.publish()  # a call of its own arrived there too: 3 against 2 + 1 on its way
        assert first.lighter_worker() is None
        second.arriving += 1
        second.publish()
        second.received_from(0)
        held[0] = MARGIN + 3
        first.publish()
        assert first.lighter_worker() == 1  # both arrived, each counted once: 5 against 3

        first.handed_over(1, count_for_s=0)  # never received (a killed worker): not for long
        assert first.lighter_worker() == 1
        again = WorkerLoads(tmp_path, 0, 2, held=lambda: held[0])  # worker 0 restarted
        try:
            again.publish()
            again.handed_over(1, count_for_s=60)
            assert again.lighter_worker() is None  # numbered on from what 1 has received
            second.arriving += 1
            second.publish()
            second.received_from(0)
            assert again.lighter_worker() is None  # 5 against 4: not worth a hop
        finally:
            again.close()
    finally:
        first.close()
        second.close()
