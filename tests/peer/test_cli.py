"""`python -m agent.peer` with scripts and CI outputs, as a process against the real agent (echo
plugin, loopback): JUnit, JSON, recordings and timelines written, exit status from the checks,
and bad input as one coded line with the report still written."""

from __future__ import annotations

import asyncio
import json
import sys
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from junitparser import JUnitXml

from agent.testing.peer.cli import add_pesq_checks, build_parser, prepare
from agent.testing.peer.report import CallReport, RunReport
from agent.testing.peer.wav import save_wav
from tests.peer.speech import bursts
from tests.support.agents import RunningAgent, wait_until


async def run_peer(*argv: str, timeout: float = 90) -> tuple[int, str, str]:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agent.peer", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(peer.communicate(), timeout)
    assert peer.returncode is not None
    return peer.returncode, out.decode(), err.decode()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.slow
async def test_a_script_writes_every_output_and_a_failed_check_fails_the_run(
        echo_agent: RunningAgent, tmp_path: Path) -> None:
    save_wav(str(tmp_path / "hello.wav"), bursts([(0.05, 0.6)], 0.7))
    (tmp_path / "talk.yaml").write_text(
        "name: talk\n"
        "session: {extra_body: {delay_frames: 10}}\n"
        "steps:\n"
        "  - play: hello.wav\n"
        "  - expect_speech: {within: 2.0}\n"
        "  - expect_event: {type: never.comes, within: 0.3}\n"
        "  - hangup\n")
    status, out, err = await run_peer(
        echo_agent.url, "--script", str(tmp_path / "talk.yaml"), "--ice-host", "127.0.0.1",
        "--junit", str(tmp_path / "junit.xml"), "--json", str(tmp_path / "report.json"),
        "--record-dir", str(tmp_path / "rec"), "--timeline", str(tmp_path / "png"))
    assert status == 1, err
    assert one_line(err) == "failed checks: 03_expect_event (-)"
    assert "pass 02_expect_speech" in out and "FAIL 03_expect_event" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False and report["name"] == "talk"
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["02_expect_speech"]["passed"] and checks["02_expect_speech"]["value"] > 0
    assert checks["03_expect_event"] == {**checks["03_expect_event"], "passed": False,
                                         "value": None, "threshold": 0.3}
    assert report["caller_speech"] and report["agent_speech"]
    assert report["response_latency_ms"] == [checks["02_expect_speech"]["value"] * 1000]
    cases = {case.name: case for suite in JUnitXml.fromfile(str(tmp_path / "junit.xml"))
             for case in suite}
    assert cases["02_expect_speech"].is_passed and not cases["03_expect_event"].is_passed
    with wave.open(report["recording_path"]) as recording:
        assert recording.getnchannels() == 2 and recording.getframerate() == 48000
        assert recording.getnframes() > 48000
    assert Path(report["timeline_path"]).stat().st_size > 10_000


@pytest.mark.slow
async def test_repeated_concurrent_calls_report_percentiles(echo_agent: RunningAgent,
                                                            tmp_path: Path) -> None:
    status, out, err = await run_peer(
        echo_agent.url, "--seconds", "2", "--repeat", "2", "--concurrency", "2",
        "--ice-host", "127.0.0.1", "--pesq", "off", "--json")
    assert status == 0, err
    body = json.loads(out)
    assert body["ok"] and body["passed"] == 2 and body["concurrency"] == 2
    assert body["aggregates"]["delay_ms"]["n"] == 2
    assert set(body["aggregates"]["delay_ms"]) == {"n", "p50", "p95"}
    # The peer's own load, for telling whether it limited the run.
    load = body["peer_load"]
    assert load["cpu_per_call_second"] > 0 and 0 < load["busiest_share"] < 0.9
    assert err == ""  # no progress bar when stderr is not a terminal, no peer_busy warning


@pytest.mark.parametrize("extra,deferred", [
    ([], False),
    (["--repeat", "3"], True),
    (["--concurrency", "2"], True),
    (["--repeat", "3", "--script", "s.yaml"], False),  # the steps listen as the call runs
])
def test_a_load_test_of_plain_calls_decodes_after_each_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str],
        deferred: bool) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("- silence: 0.1\n")
    plan = prepare(build_parser().parse_args(["http://127.0.0.1:9", *extra]))
    assert plan.options.extra.get("defer_decoding", False) is deferred


@pytest.mark.parametrize("script,code", [
    ("- hello: there\n", "unknown_step"),
    ("- play: missing.wav\n", "wav_not_found"),
    ("- silence: forever\n", "invalid_script"),
])
async def test_a_bad_script_is_one_line_before_dialling(tmp_path: Path, script: str,
                                                        code: str) -> None:
    (tmp_path / "bad.yaml").write_text(script)
    status, out, err = await run_peer("http://127.0.0.1:9", "--script",
                                      str(tmp_path / "bad.yaml"), "--junit",
                                      str(tmp_path / "j.xml"))
    assert status == 2 and out == ""
    assert one_line(err).startswith(f"error [{code}]: {tmp_path / 'bad.yaml'}")
    # The CI's test report still shows why: one failed testcase.
    [suite] = list(JUnitXml.fromfile(str(tmp_path / "j.xml")))
    [case] = list(suite)
    assert suite.name == "bad" and case.name == "arguments" and not case.is_passed
    assert f"[{code}]" in (case.result[0].message or "")


async def test_a_wrong_url_fails_in_one_line_and_the_report_is_written(tmp_path: Path) -> None:
    status, out, err = await run_peer("http://127.0.0.1:9", "--json",
                                      str(tmp_path / "r.json"), "--junit",
                                      str(tmp_path / "j.xml"))
    assert status == 1
    line = one_line(err)
    assert line.startswith("error [") and "127.0.0.1:9" in line
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] is False and report["connected"] is False and report["error_code"]
    [suite] = list(JUnitXml.fromfile(str(tmp_path / "j.xml")))
    assert [case.name for case in suite] == ["connected"]


@pytest.fixture
async def silent_server() -> AsyncIterator[int]:
    """A loopback TCP server that accepts and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_an_agent_that_never_answers_times_out(silent_server: int, tmp_path: Path) -> None:
    status, out, err = await run_peer(f"http://127.0.0.1:{silent_server}", "--timeout", "1",
                                      "--json", str(tmp_path / "r.json"))
    assert status == 1
    assert one_line(err).startswith("error [")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["connected"] is False and report["error"]


async def test_a_server_closing_mid_call_is_one_line(echo_agent: RunningAgent,
                                                     tmp_path: Path) -> None:
    (tmp_path / "wait.yaml").write_text("- silence: 6\n- hangup\n")
    peer = asyncio.ensure_future(run_peer(
        echo_agent.url, "--transport", "media-stream", "--script", str(tmp_path / "wait.yaml"),
        "--json", str(tmp_path / "r.json")))
    await wait_until(lambda: len(echo_agent.agent.legs) > 0, timeout=30)
    await asyncio.sleep(0.3)
    for leg in list(echo_agent.agent.legs):
        await leg.close("hangup")
    status, out, err = await peer
    assert status == 1
    assert one_line(err).startswith("error [closed]: the call ended early")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["connected"] is True and report["error_code"] == "closed"
    assert not {c["name"]: c for c in report["checks"]}["02_hangup"]["passed"]


def test_min_pesq_adds_a_check_with_the_score_and_the_floor() -> None:
    good = CallReport(connected=True, seconds_received=1.0, pesq=4.2, pesq_mode="wb")
    unscored = CallReport(connected=True, seconds_received=1.0, pesq_error="no speech")
    run = RunReport([good, unscored])
    add_pesq_checks(run, 3.5)
    assert good.checks[-1].passed and good.checks[-1].value == 4.2
    assert good.checks[-1].threshold == 3.5
    assert not unscored.checks[-1].passed and "no speech" in unscored.checks[-1].message
    assert not run.ok
