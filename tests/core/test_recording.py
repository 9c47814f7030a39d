"""--record-dir: a two-channel FLAC on the call's clock and a JSONL of events per call."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import av
import numpy as np
import pytest

from agent.call_settings import CallSettings
from agent.errors import AgentError
from agent.media_agent import AgentSettings
from agent.plugins.base import SessionConfig
from agent.recording import take_record_option
from agent.testing.peer import run_call
from tests.support.agents import AgentFactory, all_freed, wait_until

DELAY_FRAMES = 5  # the echo answers each frame five 80 ms frames later


def read_stereo(path: Path) -> tuple[np.ndarray, int]:
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate
        chunks = [frame.to_ndarray() for frame in container.decode(stream)]
    samples = np.concatenate(chunks, axis=1) if chunks[0].ndim == 2 and chunks[0].shape[0] == 2 \
        else np.concatenate([c.reshape(-1, 2).T for c in chunks], axis=1)
    return samples.astype(np.float32) / 32768, rate


def recording_settings(directory: Path) -> AgentSettings:
    return AgentSettings(call=CallSettings(record_dir=str(directory)))


async def test_a_call_is_recorded_caller_left_agent_right_on_one_clock(
    start_agent: AgentFactory, tmp_path: Path
) -> None:
    running = await start_agent(settings=recording_settings(tmp_path))
    report, _, _ = await run_call(running.url, seconds=3.0,
                                  session={"extra_body": {"delay_frames": DELAY_FRAMES}})
    assert report.ok and report.call_id
    await wait_until(lambda: all_freed(running))
    audio_path = tmp_path / f"{report.call_id}.flac"
    stereo, rate = read_stereo(audio_path)
    assert rate == 24000 and stereo.shape[0] == 2
    caller, agent = stereo
    assert len(caller) > 2.5 * rate and np.sqrt(np.mean(caller**2)) > 0.05
    # The agent channel is the caller channel DELAY_FRAMES frames later, to the sample.
    size = 1 << int(np.ceil(np.log2(2 * len(caller))))
    xcorr = np.fft.irfft(np.fft.rfft(agent, size) * np.conj(np.fft.rfft(caller, size)), size)
    assert int(np.argmax(xcorr[: len(caller)])) == DELAY_FRAMES * 1920

    lines = (tmp_path / f"{report.call_id}.events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    types = [entry["event"]["type"] for entry in events]
    assert "session.created" in types
    assert all(isinstance(entry["t"], float) for entry in events)


async def test_a_call_that_opts_out_leaves_no_files(start_agent: AgentFactory,
                                                     tmp_path: Path) -> None:
    running = await start_agent(settings=recording_settings(tmp_path))
    report, _, _ = await run_call(running.url, seconds=1.0,
                                  session={"extra_body": {"record": False}})
    assert report.ok
    await wait_until(lambda: all_freed(running))
    assert list(tmp_path.iterdir()) == []


async def test_an_unwritable_folder_ends_the_recording_not_the_call(
    start_agent: AgentFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    running = await start_agent(settings=recording_settings(blocker / "recordings"))
    with caplog.at_level(logging.ERROR, logger="agent.recording"):
        report, _, _ = await run_call(running.url, seconds=2.0)
        assert report.ok and report.seconds_received > 1.5
        await wait_until(lambda: all_freed(running))
    assert "error [recording_failed]" in caplog.text


def test_the_record_option_is_the_agents_not_the_plugins() -> None:
    session = SessionConfig(extra_body={"record": False, "delay_frames": 2})
    stripped, allowed = take_record_option(session)
    assert not allowed and dict(stripped.extra_body) == {"delay_frames": 2}
    assert take_record_option(SessionConfig()) == (SessionConfig(), True)
    with pytest.raises(AgentError) as refused:
        take_record_option(SessionConfig(extra_body={"record": "no"}))
    assert refused.value.code == "invalid_option"


async def test_opus_recordings_keep_both_channels_on_one_clock(
    start_agent: AgentFactory, tmp_path: Path
) -> None:
    settings = AgentSettings(call=CallSettings(record_dir=str(tmp_path), record_format="opus"))
    running = await start_agent(settings=settings)
    report, _, _ = await run_call(running.url, seconds=3.0,
                                  session={"extra_body": {"delay_frames": DELAY_FRAMES}})
    assert report.ok and report.call_id
    await wait_until(lambda: all_freed(running))
    audio_path = tmp_path / f"{report.call_id}.ogg"
    assert not (tmp_path / f"{report.call_id}.flac").exists()
    with av.open(str(audio_path)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name in ("opus", "libopus")
        rate = stream.rate
        chunks = [frame.to_ndarray() for frame in container.decode(stream)]
    raw = np.concatenate(chunks, axis=1) if chunks[0].shape[0] == 2 else \
        np.concatenate([c.reshape(-1, 2).T for c in chunks], axis=1)
    caller, agent = raw.astype(np.float32) / (32768 if raw.dtype.kind == "i" else 1)
    assert len(caller) > 2.5 * rate and np.sqrt(np.mean(caller**2)) > 0.05
    # Lossy, so compare where the agent echo peaks against the caller: DELAY_FRAMES frames
    # (at the decoder's rate), within a millisecond.
    size = 1 << int(np.ceil(np.log2(2 * len(caller))))
    xcorr = np.fft.irfft(np.fft.rfft(agent, size) * np.conj(np.fft.rfft(caller, size)), size)
    lag = int(np.argmax(xcorr[: len(caller)]))
    assert abs(lag - DELAY_FRAMES * 0.08 * rate) <= rate / 1000
    assert audio_path.stat().st_size < 0.5 * 3.0 * 24000 * 4  # well under raw s16 stereo
