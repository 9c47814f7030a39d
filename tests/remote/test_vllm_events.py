"""What vllm-omni's duplex events mean for the caller and for the pool (the facts of its
serving code as the interop issue records them: entrypoints/duplex/serving.py,
session/emitter.py)."""

from __future__ import annotations

import pytest

from agent.plugins.remote.vllm_omni import upstream_error


@pytest.mark.parametrize("code,status", [
    ("invalid_voice", 400), ("invalid_session_config", 400), ("prefill_unavailable", 503),
    ("model_path_unavailable", 503), ("timeout", 504),
])
def test_open_refusals_map_to_the_callers_status_without_blaming_the_server(
    code: str, status: int,
) -> None:
    error = upstream_error({"type": "error", "error": {"code": code, "message": "no"}},
                           opening=True)
    assert (error.code, error.status, error.pool_effect) == (code, status, None)


def test_capacity_is_resource_exhausted_or_a_rate_limit_error() -> None:
    for body in ({"code": "resource_exhausted"}, {"type": "rate_limit_error", "code": "busy"}):
        error = upstream_error({"type": "error", "error": body}, opening=True)
        assert (error.status, error.pool_effect) == (503, "full")


def test_a_server_without_the_duplex_api_is_unsupported_and_not_used_again() -> None:
    error = upstream_error({"type": "error", "error": "duplex mode is not enabled"}, opening=True)
    assert (error.code, error.status, error.pool_effect) == ("upstream_unsupported", 503, "failed")


def test_mid_session_errors_stay_server_errors() -> None:
    error = upstream_error({"type": "error", "error": {"code": "invalid_voice"}}, opening=False)
    assert error.status == 502


def test_unsequenced_handshake_events_are_not_anomalies() -> None:
    from types import SimpleNamespace

    from agent.plugins.remote.vllm_omni import VllmOmniLink

    link = SimpleNamespace(last_server_event_seq=None, seq_anomalies=0, label="x")
    for event in ({"type": "session.created"}, {"type": "error"}, {"type": "session.expired"},
                  {"type": "response.output_audio.delta", "server_event_seq": 1},
                  {"type": "response.output_audio.delta", "server_event_seq": 2}):
        VllmOmniLink._check_seq(link, event)  # type: ignore[arg-type]
    assert link.seq_anomalies == 0
    VllmOmniLink._check_seq(link, {"type": "response.done"})  # type: ignore[arg-type]
    assert link.seq_anomalies == 1  # a journaled event without its sequence number
