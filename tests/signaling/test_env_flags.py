"""Every long flag from an AGENT_<FLAG> variable (signaling/env_flags.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from signaling.__main__ import build_parser, parse_args
from signaling.env_flags import EnvFlagError, environment_argv, variable_name


def test_variable_name() -> None:
    assert variable_name("--rtc-ports") == "AGENT_RTC_PORTS"
    assert variable_name("--max-sessions") == "AGENT_MAX_SESSIONS"


def test_environment_sets_flags_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_MAX_SESSIONS", "7")
    monkeypatch.setenv("AGENT_IDLE_TIMEOUT", "3.5")
    monkeypatch.setenv("AGENT_NO_METRICS", "true")
    monkeypatch.setenv("AGENT_ADMIN_KEY", "op1, op2")
    args = parse_args(["--max-sessions", "2"])
    assert args.max_sessions == 2  # the command line wins
    assert args.idle_timeout == 3.5
    assert args.no_metrics is True
    assert args.admin_key == ["op1", "op2"]  # repeatable: a comma-separated list


def test_plugin_and_its_own_flags_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_PLUGIN", "echo")
    monkeypatch.setenv("AGENT_ECHO_MAX_SESSIONS", "3")
    args = parse_args([])
    assert args.plugin == "echo"
    assert args.echo_max_sessions == 3


def test_off_value_and_unrelated_variables_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_NO_METRICS", "0")
    monkeypatch.setenv("AGENT_WORKER_INDEX", "3")  # hidden flag: never from the environment
    monkeypatch.setenv("AGENT_GC_FREEZE", "0")  # a variable that is no flag
    args = parse_args([])
    assert args.no_metrics is False
    assert args.worker_index is None


def test_bad_on_off_value_is_a_clear_error() -> None:
    with pytest.raises(EnvFlagError, match="AGENT_NO_METRICS"):
        environment_argv(build_parser(), [], {"AGENT_NO_METRICS": "maybe"})


def test_bad_values_get_the_flags_own_message() -> None:
    env = {**os.environ, "AGENT_NO_METRICS": "maybe"}
    done = subprocess.run([sys.executable, "-m", "signaling"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "env_flag_invalid" in done.stderr and "AGENT_NO_METRICS" in done.stderr
    env = {**os.environ, "AGENT_MAX_SESSIONS": "lots"}
    done = subprocess.run([sys.executable, "-m", "signaling"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "--max-sessions" in done.stderr and "Traceback" not in done.stderr
