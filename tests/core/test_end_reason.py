"""The end reasons: one list (agent/end_reason.py), its wire strings, and the docs' table."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

from agent.end_reason import EndReason, coded, start_refused

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def documented_reasons() -> list[str]:
    """The first column of docs/operations.md's "End reasons" table."""
    text = OPERATIONS.read_text(encoding="utf-8")
    section = text.split("\n## End reasons\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [re.match(r"\| `([^`]+)` \|", row).group(1) for row in rows]  # type: ignore[union-attr]


def test_the_docs_table_lists_every_end_reason_and_no_other() -> None:
    documented = documented_reasons()
    assert len(documented) == len(set(documented)), "a reason is listed twice"
    values = [reason.value for reason in EndReason]
    assert sorted(set(values) - set(documented)) == [], "in EndReason, not in the docs' table"
    assert sorted(set(documented) - set(values)) == [], "in the docs' table, not in EndReason"


def test_an_end_reason_is_its_wire_string_everywhere() -> None:
    reason = EndReason.MEDIA_TIMEOUT
    assert reason == "media_timeout" and str(reason) == "media_timeout"
    assert f"{reason}" == "media_timeout" and format(reason) == "media_timeout"
    assert f'text="{reason}"' == 'text="media_timeout"'  # the SIP Reason header's text
    assert json.dumps({"reason": reason}) == '{"reason": "media_timeout"}'  # webhook, events
    assert {"media_timeout": 1}[reason] == 1 and {reason: 1}["media_timeout"] == 1
    assert "ended_" + reason == "ended_media_timeout"
    registry = CollectorRegistry()
    counter = Counter("ended", "", ["reason"], registry=registry)
    counter.labels(reason).inc()
    assert 'ended_total{reason="media_timeout"} 1.0' in generate_latest(registry).decode()


def test_the_wire_strings_are_unchanged() -> None:
    # What metrics, webhooks and dashboards already read: a rename here is a breaking change.
    assert {reason.value for reason in EndReason} == {
        "hangup", "remote_hangup", "stop", "socket_closed", "transport_closed", "cancelled",
        "transferred", "connection_failed", "connection_closed", "connection_lost",
        "connect_timeout", "idle_timeout", "media_timeout", "max_call_seconds",
        "server_draining", "shutdown", "setup_failed", "plugin_ended", "internal_error",
        "rejected", "busy", "no_answer", "not_found", "timeout", "auth_failed", "unreachable",
        "no_ack", "bad_answer", "no_sdp_answer", "ended", "unknown"}
    assert coded("upstream_stalled") == "upstream_stalled"
    assert start_refused("server_full") == "start_refused:server_full"
