"""Requests between nodes: signed over method, path, body and placement; any change, a
stale stamp, another secret or a missing mark is refused."""

from __future__ import annotations

import time

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from signaling.cluster import signing
from signaling.cluster.signing import NodeSigner

SECRET = b"k" * 32


def verify(signer: NodeSigner, headers: dict[str, str], method: str = "DELETE",
           path: str = "/v1/realtime/calls/call_x", body: bytes = b"") -> str | None:
    return signer.verify(CIMultiDictProxy(CIMultiDict(headers)), method, path, body)


def test_a_signed_request_names_its_node() -> None:
    a, b = NodeSigner("a", SECRET), NodeSigner("b", SECRET)
    headers = a.sign("DELETE", "/v1/realtime/calls/call_x", b"")
    assert verify(b, headers) == "a"


@pytest.mark.parametrize("change", ["method", "path", "body", "placed", "sender", "secret"])
def test_any_change_is_refused(change: str) -> None:
    a = NodeSigner("a", SECRET)
    headers = a.sign("POST", "/v1/realtime/calls", b"v=0", placed="r:1")
    method, path, body = "POST", "/v1/realtime/calls", b"v=0"
    receiver = NodeSigner("b", SECRET)
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
    else:
        receiver = NodeSigner("b", b"other" * 8)
    assert verify(receiver, headers, method, path, body) is None


def test_a_stale_or_missing_signature_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    a = NodeSigner("a", SECRET)
    headers = a.sign("GET", "/health", b"")
    later = time.time() + 60
    monkeypatch.setattr(time, "time", lambda: later)
    assert verify(a, headers, "GET", "/health") is None
    assert verify(a, {signing.FROM_HEADER: "a"}, "GET", "/health") is None
    assert verify(a, {}, "GET", "/health") is None
