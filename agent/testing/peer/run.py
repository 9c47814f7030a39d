"""Places test calls and judges them: one call (a script, or the plain play-and-listen call),
or `repeat` calls `concurrency` at a time with a progress bar, into a `RunReport`.

After each call: the transport's measurements (`measure.py`), the speech segments of both
channels (`vad.py`, on the 8 kHz audio the echo measurement already decimated where it has),
the checks (`checks.py`), PESQ (`quality.py`), and on request the stereo recording and the PNG
timeline. In a load run (`repeat` plain calls in the load-test mode, `defer_decoding`) all of
that waits until the last call has ended: the calls keep what they received as bytes, and
the analysis (decoding, echo, speech segments: more CPU per call than the live call costs
the peer) would otherwise compete with the calls still running, the very thing a load test
must not let its callers do.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import wave
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.audio.pcm import float_to_s16
from agent.testing.peer import checks as judging
from agent.testing.peer import extra
from agent.testing.peer.aligned import CallAudio, on_timeline, shared_low_rate, timeline_length
from agent.testing.peer.call import place_call
from agent.testing.peer.measure import measure_into
from agent.testing.peer.own_load import LoadWatch
from agent.testing.peer.quality import mode_for
from agent.testing.peer.quality import score as pesq_score
from agent.testing.peer.recording import Recording
from agent.testing.peer.report import CallReport, RunReport
from agent.testing.peer.script import Script
from agent.testing.peer.steps import ScriptRunner, StepTrace
from agent.testing.peer.transports.base import PeerCall, PeerError, PeerOptions, open_call
from agent.testing.peer.vad import VAD_RATE, Placed, Segment, segments_of, speech_segments
from agent.testing.peer.wav import save_wav

HANGUP_SECONDS = 5.0  # bound on a polite hang-up before the call is just closed


@dataclass
class CallPlan:
    """What each call of a run does."""

    url: str
    transport: str = "webrtc"
    options: PeerOptions = field(default_factory=PeerOptions)
    script: Script | None = None
    signal: np.ndarray | None = None  # the plain call's audio (None: the test signal)
    seconds: float = 5.0  # the plain call's length
    pesq: str = "auto"  # auto (by codec), nb, wb, off
    record_dir: str | None = None
    timeline_dir: str | None = None
    record_path: str | None = None  # the received audio as a mono WAV (one call)

    @property
    def name(self) -> str:
        return self.script.name if self.script is not None else "call"


async def run_script(plan: CallPlan) -> tuple[CallReport, PeerCall | None, list[StepTrace]]:
    """Connect, run the script's steps, hang up unless the agent did, and measure."""
    assert plan.script is not None
    report = CallReport(transport=plan.transport, url=plan.url)
    try:
        call = open_call(plan.url, plan.transport, plan.options)
    except PeerError as exc:
        report.error, report.error_code = exc.message, exc.code
        return report, None, []
    traces: list[StepTrace] = []
    runner = ScriptRunner(call, plan.script)
    try:
        await call.connect()
        traces = await runner.run()
        hung_up = any(t.observed.get("hung_up") for t in traces)
        expected = any(t.step.kind == "expect_hangup" for t in traces)
        if call.ended.is_set() and not hung_up and not expected:
            report.error = f"the call ended early ({call.end_reason})"
            report.error_code = "closed"
        elif not call.ended.is_set():
            await asyncio.wait_for(call.hangup(), HANGUP_SECONDS)
    except PeerError as exc:
        report.error, report.error_code = exc.message, exc.code
        traces = runner.traces
    except asyncio.TimeoutError:
        pass  # the hang-up went unanswered; close() below releases the call anyway
    finally:
        await call.close()
    measure_into(report, call, echo=False)
    return report, call, traces


def turn_latencies(caller: list[Segment], agent: list[Segment]) -> list[float]:
    """For each caller utterance, the gap until the agent's next utterance starts (seconds),
    where the agent starts after the caller stopped and before the caller speaks again."""
    out = []
    for index, spoken in enumerate(caller):
        following = caller[index + 1].start if index + 1 < len(caller) else float("inf")
        starts = [s.start for s in agent if spoken.end <= s.start < following]
        if starts:
            out.append(round(starts[0] - spoken.end, 3))
    return out


def channel_speech(recording: Recording, length: int) -> list[Segment]:
    """Speech segments of one channel on its timeline (`length` samples long), from the
    8 kHz audio the echo measurement already decimated when it kept it with the recording
    (then without laying the channel out: its joined samples from where they start). None
    without the peer extra's speech detector (a plain call needs no extra)."""
    if not extra.installed(extra.SPEECH):
        return []
    rate = recording.rate
    low = shared_low_rate(recording)
    if low is None or low.factor * VAD_RATE != rate:
        return speech_segments(on_timeline(recording, length), rate)
    return segments_of(low.samples, Placed(recording.joined(), low.joined_at, length), rate,
                       low.start)


def write_stereo(path: str, audio: CallAudio) -> None:
    with wave.open(path, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(audio.rate)
        out.writeframes(float_to_s16(audio.stereo().reshape(-1)).tobytes())


def analyse(plan: CallPlan, report: CallReport, call: PeerCall | None,
            traces: list[StepTrace], index: int) -> None:
    """Speech segments, checks, PESQ and the files asked for, into `report`."""
    report.name = plan.name
    if plan.record_path and call is not None:
        try:
            save_wav(plan.record_path, call.received.samples())
        except OSError as exc:
            report.error = report.error or f"--record {plan.record_path}: {exc.strerror or exc}"
            report.error_code = report.error_code or "output_unwritable"
    report.checks = judging.basic(report)
    if call is None or not report.connected or not call.received.keep_audio:
        report.checks += judging.judge(traces, [], [], 0.0)
        return
    length = max(timeline_length(call.sent), timeline_length(call.received))
    caller = channel_speech(call.sent, length)
    agent = channel_speech(call.received, length)
    report.caller_speech = [[s.start, s.end] for s in caller]
    report.agent_speech = [[s.start, s.end] for s in agent]
    judged = judging.judge(traces, caller, agent, length / call.sent.rate)
    report.checks += judged
    kinds = {t.step.label: t.step.kind for t in traces}
    if plan.script is not None:
        report.response_latency_ms = [round(float(c.value) * 1000, 1) for c in judged
                                      if kinds.get(c.name) == "expect_speech"
                                      and isinstance(c.value, float)]
    else:
        report.response_latency_ms = [round(v * 1000, 1) for v in turn_latencies(caller, agent)]
    report.barge_in_stop_ms = [float(c.value) for c in judged
                               if kinds.get(c.name) == "barge_in"
                               and isinstance(c.value, (int, float))]
    scored = plan.pesq != "off" and bool(caller) and bool(agent)
    if plan.pesq != "off" and not all(map(extra.installed, extra.NEEDS["--pesq"])):
        report.pesq_error = extra.missing("PESQ")
        scored = False
    if not (scored or plan.record_dir or plan.timeline_dir):
        return
    audio = CallAudio.of(call.sent, call.received)  # both channels laid out sample for sample
    if scored:
        mode = plan.pesq if plan.pesq in ("nb", "wb") else mode_for(report.codec, plan.transport)
        quality = pesq_score(audio.caller, audio.agent, audio.rate, mode)
        report.pesq, report.pesq_mode, report.pesq_error = (quality.score, quality.mode,
                                                            quality.error)
    stem = f"{plan.name}-{index + 1:03d}"
    if plan.record_dir:
        path = os.path.join(plan.record_dir, f"{stem}.wav")
        write_stereo(path, audio)
        report.recording_path = path
    if plan.timeline_dir:
        from agent.testing.peer.timeline import render  # matplotlib: only when asked for

        path = os.path.join(plan.timeline_dir, f"{stem}.png")
        render(path, audio, caller, agent, call.events, report.checks, title=stem)
        report.timeline_path = path


async def one_call(plan: CallPlan, index: int = 0) -> CallReport:
    call: PeerCall | None
    traces: list[StepTrace] = []
    if plan.script is not None:
        report, call, traces = await run_script(plan)
    else:
        report, call = await place_call(plan.url, plan.transport, plan.options,
                                        signal=plan.signal, seconds=plan.seconds)
    # The analysis is CPU work on finished recordings: off the loop, where other calls of a
    # load run are still live.
    await asyncio.to_thread(analyse, plan, report, call, traces, index)
    return report


def _progress(total: int, desc: str = "calls") -> Any:
    """A tqdm bar on stderr, silent when stderr is not a terminal (CI logs); none without
    the peer extra."""
    if not extra.installed(extra.PROGRESS):
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="call", file=sys.stderr, disable=not sys.stderr.isatty(),
                desc=desc)


def analysed_after_the_run(plan: CallPlan) -> bool:
    """Whether a load run of `plan` measures its calls only once they have all ended."""
    return plan.script is None and bool(plan.options.extra.get("defer_decoding"))


def _measure_and_analyse(plan: CallPlan, held: list[tuple[CallReport, PeerCall | None]],
                         progress: bool) -> None:
    bar = _progress(len(held), "analysing") if progress else None
    try:
        for index, (report, call) in enumerate(held):
            if call is not None:
                measure_into(report, call, echo=plan.signal is None)
            analyse(plan, report, call, [], index)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


async def run_calls(plan: CallPlan, repeat: int = 1, concurrency: int = 1,
                    progress: bool = True) -> RunReport:
    """`repeat` calls, at most `concurrency` at once; reports in call order."""
    started = time.monotonic()
    gate = asyncio.Semaphore(max(1, concurrency))
    bar = _progress(repeat) if progress else None
    later = analysed_after_the_run(plan)
    held: list[tuple[CallReport, PeerCall | None]] = [(CallReport(), None)] * repeat

    async def gated(index: int) -> CallReport:
        async with gate:
            if later:  # measured after the run; until then only a transport error shows
                report, call = await place_call(plan.url, plan.transport, plan.options,
                                                signal=plan.signal, seconds=plan.seconds,
                                                measure=False)
                held[index] = (report, call)
            else:
                report = await one_call(plan, index)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(failed=sum(1 for r in done if not r.ok) + (not report.ok))
        done.append(report)
        return report

    done: list[CallReport] = []
    watch = LoadWatch()
    watch.start()
    try:
        reports = await asyncio.gather(*(gated(i) for i in range(repeat)))
    finally:
        own = await watch.stop()
        if bar is not None:
            bar.close()
    if later:
        before = time.process_time()
        await asyncio.to_thread(_measure_and_analyse, plan, held, progress)
        own.analysis_cpu_seconds = time.process_time() - before
    own.call_seconds = sum(report.seconds_sent for report in reports)
    return RunReport(calls=list(reports), seconds=time.monotonic() - started,
                     concurrency=concurrency, own_load=own)
