"""Ids in a cluster: the node tag, then the worker tag, in the same length and alphabet."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent import worker_tag
from agent.worker_tag import ID_TOKEN_BYTES, ID_TOKEN_CHARS, TAGS


@pytest.fixture(autouse=True)
def untagged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(worker_tag, "_tag", "")
    monkeypatch.setattr(worker_tag, "_node", "")
    yield


def test_a_cluster_id_names_its_node_and_worker() -> None:
    worker_tag.set_worker(3)
    worker_tag.set_node("Q")
    token = worker_tag.tagged_token(ID_TOKEN_BYTES)
    assert len(token) == ID_TOKEN_CHARS and token[:2] == "Q3"
    assert all(c in TAGS + "-_" for c in token)
    assert worker_tag.node_of("call_" + token, ID_TOKEN_CHARS) == "Q"
    assert worker_tag.worker_of("call_" + token, ID_TOKEN_CHARS) == 3
    assert worker_tag.made_here("call_" + token, ID_TOKEN_CHARS)
    # 22 random base64url characters are left: 132 bits
    assert (ID_TOKEN_CHARS - 2) * 6 >= 120


def test_a_single_process_node_is_worker_zero() -> None:
    worker_tag.set_node("b")
    token = worker_tag.tagged_token(ID_TOKEN_BYTES)
    assert token[:2] == "b0"
    assert worker_tag.worker_of(token, ID_TOKEN_CHARS) == 0
    assert not worker_tag.made_here("c0" + token[2:], ID_TOKEN_CHARS)


def test_outside_a_cluster_ids_name_no_node() -> None:
    worker_tag.set_worker(1)
    token = worker_tag.tagged_token(ID_TOKEN_BYTES)
    assert token[0] == "1" and worker_tag.node_of(token, ID_TOKEN_CHARS) is None
    with pytest.raises(ValueError):
        worker_tag.set_node("ab")
