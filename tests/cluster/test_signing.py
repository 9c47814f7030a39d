"""Requests between nodes: signed over both nodes' tags, method, path, body, placement, a
timestamp and a nonce; any change, a stale stamp (by an injected clock), another secret or
a missing mark is refused (403), one signed for another node too (421), and a signature is
good once: a second use is refused (409) by the same process, by another process sharing
the real redis-server, and by the process alone while Redis is down."""

from __future__ import annotations

from pathlib import Path

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from signaling.cluster import signing
from signaling.cluster.signing import LocalNonces, NodeGate, NodeSigner
from signaling.cluster.store import Store
from signaling.errors import ApiError
from tests.cluster.support import Redis, free_port

SECRET = b"k" * 32
T0 = 1_900_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def node(tag: str, clock: Clock | None = None, secret: bytes = SECRET) -> NodeSigner:
    return NodeSigner(tag, secret, clock or Clock())


def check(signer: NodeSigner, headers: dict[str, str], method: str = "DELETE",
          path: str = "/v1/realtime/calls/call_x", body: bytes = b"") -> signing.Signed:
    return signer.check(CIMultiDictProxy(CIMultiDict(headers)), method, path, body)


def refusal(signer: NodeSigner, headers: dict[str, str], *args: object) -> tuple[int, str]:
    with pytest.raises(ApiError) as refused:
        check(signer, headers, *args)  # type: ignore[arg-type]
    return refused.value.status, refused.value.code


def test_a_signed_request_names_its_node() -> None:
    headers = node("a").sign("DELETE", "/v1/realtime/calls/call_x", b"", to="b")
    signed = check(node("b"), headers)
    assert signed.sender == "a" and signed.stale_at == T0 + 30


@pytest.mark.parametrize("change", ["method", "path", "body", "placed", "sender", "secret",
                                    "target", "nonce", "stamp"])
def test_any_change_is_refused(change: str) -> None:
    headers = node("a").sign("POST", "/v1/realtime/calls", b"v=0", to="b", placed="r:1")
    method, path, body = "POST", "/v1/realtime/calls", b"v=0"
    receiver = node("b")
    signature = headers[signing.SIGNATURE_HEADER]
    if change == "method":
        method = "PUT"
    elif change == "path":
        path = "/v1/realtime/calls?x=1"
    elif change == "body":
        body = b"v=1"
    elif change == "placed":
        headers[signing.PLACED_HEADER] = "r:2"
    elif change == "sender":
        headers[signing.FROM_HEADER] = "c"
    elif change == "secret":
        receiver = node("b", secret=b"other" * 8)
    elif change == "target":  # rewritten to pass at node c: the MAC no longer matches
        headers[signing.SIGNATURE_HEADER] = signature.replace("to=b", "to=c")
        receiver = node("c")
    elif change == "nonce":
        headers[signing.SIGNATURE_HEADER] = signature.replace(",n=", ",n=x")
    else:
        headers[signing.SIGNATURE_HEADER] = signature.replace(f"t={T0:.3f}", f"t={T0 + 1:.3f}")
    assert refusal(receiver, headers, method, path, body) == (403, "node_signature_invalid")


def test_a_request_signed_for_another_node_is_misdirected() -> None:
    headers = node("a").sign("POST", "/v1/telephony/rtp", b"{}", to="b")
    assert refusal(node("c"), headers, "POST", "/v1/telephony/rtp", b"{}") == (
        421, "node_misdirected")


@pytest.mark.parametrize(("skew", "good"), [(29.9, True), (30.1, False), (-29.9, True),
                                            (-30.1, False)])
def test_a_stamp_is_good_for_30_seconds_either_way(skew: float, good: bool) -> None:
    headers = node("a").sign("GET", "/health", b"", to="b")
    receiver = node("b", Clock(T0 + skew))
    if good:
        assert check(receiver, headers, "GET", "/health").sender == "a"
    else:
        assert refusal(receiver, headers, "GET", "/health") == (403, "node_signature_invalid")


def test_a_missing_or_malformed_signature_is_refused() -> None:
    b = node("b")
    assert refusal(b, {signing.FROM_HEADER: "a"}, "GET", "/health")[0] == 403
    assert refusal(b, {}, "GET", "/health")[0] == 403
    headers = node("a").sign("GET", "/health", b"", to="b")
    headers[signing.SIGNATURE_HEADER] = headers[signing.SIGNATURE_HEADER].replace(
        f"t={T0:.3f}", "t=soon")
    assert refusal(b, headers, "GET", "/health")[0] == 403


def test_two_signatures_of_the_same_request_differ() -> None:
    a = node("a")
    first, second = (a.sign("GET", "/health", b"", to="b")[signing.SIGNATURE_HEADER]
                     for _ in range(2))
    assert first != second


async def admit(gate: NodeGate, headers: dict[str, str]) -> str | int:
    try:
        return await gate.admit(CIMultiDictProxy(CIMultiDict(headers)), "POST",
                                "/v1/telephony/rtp", b"{}")
    except ApiError as refused:
        assert refused.code == "node_request_replayed" or refused.status != 409
        return refused.status


async def test_a_signature_is_good_once_in_one_process() -> None:
    clock = Clock()
    gate = NodeGate(node("b", clock))
    headers = node("a", clock).sign("POST", "/v1/telephony/rtp", b"{}", to="b")
    assert [await admit(gate, headers) for _ in range(4)] == ["a", 409, 409, 409]
    assert gate.replays == 3
    fresh = node("a", clock).sign("POST", "/v1/telephony/rtp", b"{}", to="b")
    assert await admit(gate, fresh) == "a"  # each new signature is good once


async def test_a_signature_is_good_once_across_processes_sharing_redis(redis: Redis) -> None:
    """Two workers of a node (or two processes) each with its own table: Redis says."""
    clock = Clock()
    stores = [Store(redis.url, "agent:") for _ in range(2)]
    try:
        gates = [NodeGate(node("b", clock), store.first_use) for store in stores]
        headers = node("a", clock).sign("POST", "/v1/telephony/rtp", b"{}", to="b")
        assert await admit(gates[0], headers) == "a"
        assert await admit(gates[1], headers) == 409
        keys = redis.keys("agent:nonce:a:*")
        assert len(keys) == 1
        # kept as long as the stamp is good (30 s) and a second more, not for ever
        assert 29_000 < int(redis.command("PTTL", keys[0])) <= 31_000
    finally:
        for store in stores:
            await store.close()


async def test_while_redis_is_down_the_process_still_refuses_a_replay(tmp_path: Path) -> None:
    store = Store(f"redis://127.0.0.1:{free_port()}/0", "agent:")  # nobody listening
    try:
        clock = Clock()
        gate = NodeGate(node("b", clock), store.first_use)
        headers = node("a", clock).sign("POST", "/v1/telephony/rtp", b"{}", to="b")
        assert await admit(gate, headers) == "a"
        assert not store.reachable
        assert await admit(gate, headers) == 409
    finally:
        await store.close()


def test_the_local_table_is_bounded_and_forgets_stale_nonces() -> None:
    table = LocalNonces(limit=3)
    for index in range(5):
        assert table.first_use(f"n{index}", T0 + 30, T0)
    assert len(table) == 3 and table.forgotten == 2
    assert not table.first_use("n4", T0 + 30, T0)
    assert table.first_use("late", T0 + 61, T0 + 31)  # the others are stale: all gone
    assert len(table) == 1
