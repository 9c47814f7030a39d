"""Recording limits: --record-max-seconds closes a call's recording (a valid file that long)
and --record-min-free-mb stops it (or never starts it) on a nearly full disk; either way the
events file says why, one line is logged, and the call goes on."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from agent import recording
from agent.call_settings import CallSettings, RecordLimits
from agent.media_agent import AgentSettings
from agent.recording import LOW_DISK_SPACE, MAX_SECONDS, CallRecorder
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory, all_freed, wait_until

RATE = 24000
TICK = 1920  # one 80 ms ticker frame at 24 kHz
HUGE_FLOOR_MB = 10.0**9


def tone(index: int) -> np.ndarray:
    t = (np.arange(TICK) + index * TICK) / RATE
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def audio_seconds(path: Path) -> float:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.rate


def events_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line)["event"] for line in path.read_text().splitlines()]


def stop_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "recording stopped" in r.getMessage()]


async def feed(recorder: CallRecorder, ticks: int, first: int = 0) -> None:
    for index in range(first, first + ticks):
        recorder.add_tick(tone(index), tone(index))
        if index % 5 == 0:
            recorder.add_event({"type": "tick", "index": index})
        await asyncio.sleep(0)


@pytest.mark.parametrize("record_format", ["flac", "opus"])
async def test_max_seconds_closes_a_valid_file_exactly_that_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, record_format: str,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.recording")
    recorder = CallRecorder(tmp_path, "call_max", RATE, record_format,
                            RecordLimits(max_seconds=1.0, min_free_mb=0))
    await feed(recorder, 40)  # 3.2 s of call
    await wait_until(lambda: recorder.stopped == MAX_SECONDS)
    await feed(recorder, 10, first=40)  # the call goes on; nothing more is taken
    await recorder.close()
    seconds = audio_seconds(recorder.audio_path)
    if record_format == "flac":
        assert seconds == 1.0  # cut to the sample
    else:
        assert abs(seconds - 1.0) < 0.03  # Opus frames and pre-skip
    events = events_of(recorder.events_path)
    assert events[-1]["type"] == "recording.stopped" and events[-1]["reason"] == MAX_SECONDS
    assert max(e["index"] for e in events if e["type"] == "tick") < 40
    assert len(stop_lines(caplog)) == 1 and stop_lines(caplog)[0].levelno == logging.INFO
    assert recorder.failed is None


async def test_below_the_disk_floor_no_recording_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.recording")
    recorder = CallRecorder(tmp_path, "call_full", RATE, "flac",
                            RecordLimits(max_seconds=0, min_free_mb=HUGE_FLOOR_MB))
    await feed(recorder, 25)
    await recorder.close()
    assert recorder.stopped == LOW_DISK_SPACE and recorder.failed is None
    assert not recorder.audio_path.exists()
    (note,) = events_of(recorder.events_path)
    assert note["type"] == "recording.stopped" and note["reason"] == LOW_DISK_SPACE
    (line,) = stop_lines(caplog)
    assert line.levelno == logging.WARNING and "--record-min-free-mb" in line.getMessage()


async def test_free_space_is_looked_at_every_few_seconds_not_per_frame(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    looks: list[Path] = []
    real_disk_usage = shutil.disk_usage

    def counted(path: Any) -> Any:
        looks.append(Path(path))
        return real_disk_usage(path)

    monkeypatch.setattr(recording.shutil, "disk_usage", counted)
    monkeypatch.setattr(recording, "DISK_CHECK_SECONDS", 0.3)
    caplog.set_level(logging.INFO, logger="agent.recording")
    recorder = CallRecorder(tmp_path, "call_floor", RATE, "flac",
                            RecordLimits(max_seconds=0, min_free_mb=1))
    await feed(recorder, 100)  # 8 s of audio in a moment: one look, when it started
    await wait_until(lambda: recorder.frames == 100 and len(looks) >= 1)
    await asyncio.sleep(0.1)
    assert looks == [tmp_path]
    # The disk "fills up" (the floor rises past what is free): the next look stops it.
    recorder.limits = RecordLimits(max_seconds=0, min_free_mb=HUGE_FLOOR_MB)
    await asyncio.sleep(0.35)
    await feed(recorder, 5, first=100)
    await wait_until(lambda: recorder.stopped == LOW_DISK_SPACE)
    await feed(recorder, 5, first=105)
    await recorder.close()
    assert len(looks) == 2
    assert audio_seconds(recorder.audio_path) == 100 * TICK / RATE  # valid, and finalised
    assert events_of(recorder.events_path)[-1]["reason"] == LOW_DISK_SPACE


def test_cli_flags_reach_the_call_settings() -> None:
    from signaling.__main__ import build_parser, settings_from_args

    parser = build_parser()
    defaults = settings_from_args(parser.parse_args([])).call
    assert defaults.record_limits == RecordLimits(max_seconds=3600.0, min_free_mb=512.0)
    given = settings_from_args(parser.parse_args(
        ["--record-max-seconds", "90", "--record-min-free-mb", "2048"])).call
    assert given.record_limits == RecordLimits(max_seconds=90.0, min_free_mb=2048.0)


# -- on real calls ------------------------------------------------------------------------------


async def test_a_call_longer_than_max_seconds_keeps_going_after_its_recording_closed(
    start_agent: AgentFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.recording")
    settings = AgentSettings(call=CallSettings(record_dir=str(tmp_path), record_max_seconds=1.0))
    running = await start_agent(settings=settings)
    report, _, _ = await run_call(running.url, seconds=3.0)
    assert report.ok and report.call_id and report.seconds_received > 2.5  # the call went on
    await wait_until(lambda: all_freed(running))
    assert audio_seconds(tmp_path / f"{report.call_id}.flac") == 1.0
    events = events_of(tmp_path / f"{report.call_id}.events.jsonl")
    assert events[-1]["type"] == "recording.stopped" and events[-1]["reason"] == MAX_SECONDS
    assert len(stop_lines(caplog)) == 1


async def test_a_call_on_a_full_disk_is_not_recorded_but_works(
    start_agent: AgentFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.recording")
    settings = AgentSettings(call=CallSettings(record_dir=str(tmp_path),
                                               record_min_free_mb=HUGE_FLOOR_MB))
    running = await start_agent(settings=settings)
    report, _, _ = await run_call(running.url, seconds=2.0)
    assert report.ok and report.call_id and report.seconds_received > 1.5
    await wait_until(lambda: all_freed(running))
    assert not (tmp_path / f"{report.call_id}.flac").exists()
    (line,) = stop_lines(caplog)
    assert line.levelno == logging.WARNING and LOW_DISK_SPACE in line.getMessage()
    events = events_of(tmp_path / f"{report.call_id}.events.jsonl")
    assert events[-1]["reason"] == LOW_DISK_SPACE
