"""The pytest plugin (agent/testing/peer/pytest_plugin.py): the example test file runs green
under pytest as a user would run it, and `agent_server` starts and stops a real server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from agent.testing.peer.pytest_plugin import AgentCaller, AgentServer, _healthy, running_agent
from tests.support.agents import RunningAgent

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_plugin_is_declared_as_a_pytest11_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {
        "duplex_agent": "agent.testing.peer.pytest_plugin"}


def test_the_example_test_file_passes_under_pytest(tmp_path: Path) -> None:
    if shutil.which("espeak-ng") is None:  # the example's script speaks with `say`
        if os.environ.get("CI"):
            pytest.fail("espeak-ng is missing under CI; scripts/install-test-deps.sh installs it")
        pytest.skip("espeak-ng is not installed")
    # A separate pytest, as a user runs it: the plugin comes in through its entry point.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "examples" / "test_voice_agent.py"), "--basetemp", str(tmp_path / "t")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


def test_agent_server_runs_until_the_block_ends_and_is_stopped_by_pid(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with running_agent(["--plugin", "echo"], str(log)) as server:
        assert isinstance(server, AgentServer) and _healthy(server.url)
        pid = server.pid
    assert not _healthy(server.url)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: no such process any more
    assert "serving plugin echo" in log.read_text()


def test_a_server_that_cannot_start_fails_the_test_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        with running_agent(["--plugin", "no-such-plugin"], str(tmp_path / "server.log")):
            pass
    assert "exited with status" in str(failed.value) and "no-such-plugin" in str(failed.value)


async def test_agent_call_awaits_in_an_async_test(echo_agent: RunningAgent) -> None:
    # The in-process server runs on this test's loop, which the call must not block.
    report = await AgentCaller().call(echo_agent.url, transport="media-stream", seconds=1.5,
                                      pesq="off")
    assert report.ok, report.checks
    assert report.transport == "media-stream" and report.delay_ms is not None
    assert [check.name for check in report.checks] == ["connected", "call_completed",
                                                       "audio_received"]


def test_a_bad_script_fails_the_test_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        AgentCaller()("http://127.0.0.1:9", script=[{"wait": 1}])
    assert str(failed.value).startswith("error [unknown_step]: script: step 1")


def test_a_missing_script_fails_without_an_exception_chain(tmp_path: Path) -> None:
    # pytest prints a failure's context ("During handling of the above exception...") above
    # its one line: the failure is raised outside the handler, with no context to print.
    missing = tmp_path / "greeting.yaml"
    with pytest.raises(pytest.fail.Exception) as failed:
        AgentCaller()("http://127.0.0.1:9", script=str(missing))
    assert str(failed.value) == f"error [script_not_found]: --script {missing}: no such file"
    assert failed.value.__context__ is None and failed.value.__cause__ is None
