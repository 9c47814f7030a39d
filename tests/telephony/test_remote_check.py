"""A remote named by SDP: a burst, then nothing until it is heard (remote_check.py)."""

from __future__ import annotations

from agent.telephony.remote_check import RemoteCheck


def test_a_burst_then_nothing_until_confirmed() -> None:
    check = RemoteCheck(burst=3)
    assert [check.may_send() for _ in range(5)] == [True, True, True, False, False]
    assert check.stats() == {"remote_confirmed": False, "packets_withheld": 2}
    check.confirm("192.0.2.1")
    assert all(check.may_send() for _ in range(100))


def test_a_move_to_another_host_starts_over_and_the_same_host_stays_confirmed() -> None:
    check = RemoteCheck(burst=2)
    check.confirm("192.0.2.1")
    check.moved("192.0.2.1")  # a new port on the same host
    assert check.confirmed
    check.moved("198.51.100.7")
    assert not check.confirmed
    assert [check.may_send() for _ in range(3)] == [True, True, False]
    check.moved("203.0.113.9")  # each new offer: one more burst, no more
    assert [check.may_send() for _ in range(3)] == [True, True, False]
