"""Which node a full node's media stream is carried to (signaling/cluster/sockets.py
`with_room`); the relays themselves run end to end in test_cluster.py (sidebands through
HAProxy, a full node's media stream)."""

from __future__ import annotations

from signaling.cluster.registry import NodeTable
from signaling.cluster.sockets import with_room


def table(*rows: tuple[str, str, int, int]) -> NodeTable:
    nodes = NodeTable()
    nodes.update([[tag, f"http://10.0.0.{i}:8080", state, capacity, calls, "{}"]
                  for i, (tag, state, capacity, calls) in enumerate(rows, 2)])
    return nodes


def test_least_loaded_serving_nodes_with_room_other_than_this_one() -> None:
    nodes = table(("A", "serving", 4, 4), ("B", "serving", 4, 3), ("C", "serving", 8, 2),
                  ("D", "draining", 4, 0), ("E", "serving", 2, 2), ("F", "starting", 4, 0),
                  ("G", "serving", 0, 9))
    assert [info.tag for info in with_room(nodes, "A")] == ["G", "C", "B"]
    assert [info.tag for info in with_room(nodes, "G")] == ["C", "B"]


def test_no_other_node_with_room() -> None:
    assert with_room(table(("A", "serving", 1, 1), ("B", "serving", 1, 1)), "A") == []
    assert with_room(NodeTable(), "A") == []


def test_a_record_without_media_reads_as_none() -> None:
    nodes = NodeTable()
    nodes.update([["A", "http://10.0.0.2:8080", "serving", 1, 0],
                  ["B", "http://10.0.0.3:8080", "serving", 1, 0, "not json"],
                  ["C", "http://10.0.0.4:8080", "serving", 1, 0, '{"ice_hosts": ["x"]}']])
    assert [nodes.nodes[tag].media for tag in "ABC"] == [{}, {}, {"ice_hosts": ["x"]}]
