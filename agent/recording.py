"""Call recording (opt-in with `--record-dir`): two-channel FLAC or Ogg-Opus, and a JSONL of events.

The ticker hands over each tick's caller frame and the agent's answer to it, so both
channels sit on the call's own clock: sample n of the left channel (caller) is what the
model heard at the moment it spoke sample n of the right channel (agent). Encoding and
writing happen on one shared worker thread, never on the event loop. A full disk or an
unwritable folder ends the recording with one logged coded error; the call goes on.

Limits (`RecordLimits`, from `--record-max-seconds` and `--record-min-free-mb`): a recording
that reaches `max_seconds` of audio is closed there (the file finalised, exactly that long),
and one whose folder's file system has less than `min_free_mb` free — checked on the writer
thread when the recording starts and then every `DISK_CHECK_SECONDS`, never per frame — is
closed too (none is made if it starts below). Each logs one line and notes the stop as the
last line of the events file (`{"type": "recording.stopped", "reason": ...}`); the call goes on.

Files: `<call_id>.flac` (FLAC via PyAV, s16 stereo at the plugin's rate; lossless) or, with
`--record-format opus`, `<call_id>.ogg` (Opus in Ogg via PyAV/libopus, about a tenth of the
size; decoders play it at 48 kHz), and
`<call_id>.events.jsonl` (one object per line: `t` seconds since the call's first tick,
`event` as sent to the client, or the leg's DTMF and errors). Keeping and deleting them is
the operator's job: nothing here prunes old recordings.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import av
import numpy as np

from agent.call_settings import RecordLimits
from agent.errors import AgentError
from agent.plugins.base import SessionConfig

log = logging.getLogger(__name__)

RECORD_OPTION = "record"  # extra_body key: false opts a call out of recording
DISK_CHECK_SECONDS = 5.0  # free space is looked at this often while recording (writer thread)
MAX_SECONDS = "max_seconds"  # stop reasons, as the log and the events file name them
LOW_DISK_SPACE = "low_disk_space"


@dataclass(frozen=True)
class RecordFormat:
    container: str
    codec: str
    suffix: str
    sample_format: str
    fixed_frames: bool  # the encoder takes frames of exactly its frame_size


RECORD_FORMATS = {
    "flac": RecordFormat("flac", "flac", ".flac", "s16", fixed_frames=False),
    "opus": RecordFormat("ogg", "libopus", ".ogg", "s16", fixed_frames=True),
}

_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recording")


def take_record_option(session: SessionConfig) -> tuple[SessionConfig, bool]:
    """The session without the agent's own `record` key (plugins refuse keys they do not
    know), and whether the caller allows recording (default yes)."""
    if RECORD_OPTION not in session.extra_body:
        return session, True
    value = session.extra_body[RECORD_OPTION]
    if not isinstance(value, bool):
        raise AgentError("invalid_option", "extra_body.record must be true or false",
                         param="extra_body.record")
    rest = {key: item for key, item in session.extra_body.items() if key != RECORD_OPTION}
    return replace(session, extra_body=rest), value


def _to_s16(audio: np.ndarray, length: int) -> np.ndarray:
    mono = np.asarray(audio, dtype=np.float32).reshape(-1)[:length]
    if len(mono) < length:
        mono = np.concatenate([mono, np.zeros(length - len(mono), dtype=np.float32)])
    return (np.clip(mono, -1.0, 1.0) * 32767.0).astype(np.int16)


class CallRecorder:
    """Records one call. Every method is safe to call from the event loop: the work is queued
    on the writer thread in order, and failures only stop the recording."""

    def __init__(self, directory: str | Path, call_id: str, sample_rate: int,
                 record_format: str = "flac", limits: RecordLimits | None = None) -> None:
        self.directory = Path(directory)
        self.call_id = call_id
        self.sample_rate = sample_rate
        self.format = RECORD_FORMATS[record_format]
        self.limits = limits or RecordLimits()
        self._max_samples = (round(self.limits.max_seconds * sample_rate)
                             if self.limits.max_seconds > 0 else None)
        self._disk_checked_at: float | None = None
        self.audio_path = self.directory / f"{call_id}{self.format.suffix}"
        self.events_path = self.directory / f"{call_id}.events.jsonl"
        self.failed: str | None = None  # the coded reason the recording stopped early
        self.stopped: str | None = None  # a limit the recording reached (MAX_SECONDS, ...)
        self.frames = 0
        self._started_at: float | None = None
        self._container: Any = None
        self._stream: Any = None
        self._events: IO[str] | None = None
        self._pts = 0
        self._rechunk: Any = None  # to the encoder's fixed frame size (Opus), if it has one
        self._last: Future[None] | None = None

    # -- called on the event loop -----------------------------------------------------------

    @property
    def recording(self) -> bool:
        """Still taking audio and events: not failed, no limit reached."""
        return self.failed is None and self.stopped is None

    def add_tick(self, caller: np.ndarray, agent: np.ndarray) -> None:
        if not self.recording:
            return
        if self._started_at is None:
            self._started_at = time.monotonic()
        length = len(caller)
        stereo = np.stack([_to_s16(caller, length), _to_s16(agent, length)])
        self.frames += 1
        self._submit(self._write_audio, stereo)

    def add_event(self, event: Mapping[str, Any]) -> None:
        if not self.recording:
            return
        self._submit(self._write_event, self._event_line(event))

    def _event_line(self, event: Mapping[str, Any]) -> str:
        started = self._started_at if self._started_at is not None else time.monotonic()
        return json.dumps({"t": round(time.monotonic() - started, 3), "event": event},
                          default=str)

    async def close(self) -> None:
        future = _writer.submit(self._close_files)
        await asyncio.wrap_future(future)

    # -- on the writer thread ---------------------------------------------------------------

    def _submit(self, work: Any, item: Any) -> None:
        self._last = _writer.submit(self._guarded, work, item)

    def _guarded(self, work: Any, item: Any) -> None:
        if not self.recording:
            return
        try:
            if self._disk_check_due():
                self._check_disk_space()
            if self.recording:
                work(item)
        except (OSError, av.error.FFmpegError) as exc:
            self._fail(exc)

    # -- limits (writer thread) -------------------------------------------------------------

    def _disk_check_due(self) -> bool:
        """At the first write, then at most every DISK_CHECK_SECONDS: not per frame."""
        if self.limits.min_free_mb <= 0:
            return False
        now = time.monotonic()
        if self._disk_checked_at is not None and now - self._disk_checked_at < DISK_CHECK_SECONDS:
            return False
        self._disk_checked_at = now
        return True

    def _check_disk_space(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        free_mb = shutil.disk_usage(self.directory).free / 2**20
        if free_mb < self.limits.min_free_mb:
            self._stop(LOW_DISK_SPACE, f"{free_mb:.0f} MB free in {self.directory}, under "
                       f"--record-min-free-mb {self.limits.min_free_mb:g}", logging.WARNING)

    def _samples_left(self) -> int | None:
        """Audio samples the time limit still allows; None: no limit."""
        return None if self._max_samples is None else self._max_samples - self._pts

    def _stop(self, reason: str, detail: str, level: int) -> None:
        """A limit reached: finalise the files, note why in the events file, log one line.
        Later ticks and events are dropped; the call goes on."""
        self.stopped = reason
        log.log(level, "call %s: recording stopped [%s]: %s; the call goes on",
                self.call_id, reason, detail)
        self._finish_audio()
        try:
            self._write_event(self._event_line(
                {"type": "recording.stopped", "reason": reason, "message": detail}))
        except OSError as exc:
            log.warning("call %s: could not note the recording's stop: %s", self.call_id,
                        getattr(exc, "strerror", None) or exc)
        self._finish_events()

    def _fail(self, exc: BaseException) -> None:
        self.failed = "recording_failed"
        reason = getattr(exc, "strerror", None) or str(exc)
        log.error("call %s: error [recording_failed]: recording stopped, the call goes on: %s",
                  self.call_id, reason)
        self._close_quietly()

    def _open_audio(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.audio_path), "w", format=self.format.container)
        self._stream = self._container.add_stream(self.format.codec, rate=self.sample_rate,
                                                  layout="stereo")
        self._stream.format = self.format.sample_format
        if self.format.fixed_frames:
            self._stream.codec_context.open()
            self._rechunk = av.AudioResampler(format=self.format.sample_format, layout="stereo",
                                              rate=self.sample_rate,
                                              frame_size=self._stream.codec_context.frame_size)

    def _write_audio(self, stereo: np.ndarray) -> None:
        left = self._samples_left()
        if left is not None and left < stereo.shape[1]:
            stereo = stereo[:, :max(0, left)]  # the file ends exactly at the limit
        if stereo.shape[1]:
            if self._container is None:
                self._open_audio()
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(stereo.T.reshape(1, -1)), format="s16", layout="stereo")
            frame.sample_rate = self.sample_rate
            frame.pts = self._pts
            self._pts += stereo.shape[1]
            self._encode(frame)
        if left is not None and self._samples_left() == 0:
            self._stop(MAX_SECONDS, f"{self.limits.max_seconds:g} s recorded, the "
                       "--record-max-seconds limit", logging.INFO)

    def _encode(self, frame: Any) -> None:
        frames = [frame] if self._rechunk is None else self._rechunk.resample(frame)
        for chunk in frames:
            for packet in self._stream.encode(chunk):
                self._container.mux(packet)

    def _write_event(self, line: str) -> None:
        if self._events is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._events = open(self.events_path, "a", encoding="utf-8")
        self._events.write(line + "\n")

    def _close_files(self) -> None:
        if self.failed is not None:
            return
        try:
            self._finish_audio()
            self._finish_events()
        except (OSError, av.error.FFmpegError) as exc:
            self._fail(exc)

    def _finish_audio(self) -> None:
        """Flush the encoder and close the audio file (a valid, complete file)."""
        if self._container is None:
            return
        if self._rechunk is not None:
            self._encode(None)  # the last partial chunk
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        self._container = None

    def _finish_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def _close_quietly(self) -> None:
        for closing in (self._container, self._events):
            if closing is None:
                continue
            try:
                closing.close()
            except Exception:  # already failing: the first error was logged
                pass
        self._container = None
        self._events = None


def recorder_for(record_dir: str | None, allowed: bool, call_id: str, sample_rate: int,
                 record_format: str = "flac",
                 limits: RecordLimits | None = None) -> CallRecorder | None:
    if not record_dir or not allowed:
        return None
    return CallRecorder(os.path.expanduser(record_dir), call_id, sample_rate, record_format,
                        limits)
