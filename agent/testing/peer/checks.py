"""The checks of a call: each expectation judged with a measured value and its threshold.

Script expectations are judged after the call from the step traces (`steps.py`) and the
speech segments of both channels (`vad.py`, on the t0 timeline):

- `expect_speech`: the response latency, from the end of the caller's last speech before the
  step (or the step's start when the caller had not spoken) to the agent's speech (0 when the
  agent is still speaking then), against `within`;
- `barge_in`: the stop time, from the start of the caller's interrupting speech to the end of
  the agent's speech it talked over, against `expect_stop_within_ms`;
- `expect_event`, `expect_transcript`, `expect_hangup`: the time from the step's start to the
  event, the transcript piece completing the phrase, or the end of the call;
- an action (`dtmf`, `session_update`, `hangup`, ...) that could not be done fails as a check
  of its own, with the transport's error.

A call without a script gets the basic checks: connected, audio came back.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.testing.peer.report import CallReport, CheckResult
from agent.testing.peer.steps import StepTrace
from agent.testing.peer.vad import Segment

EDGE_SLACK = 0.1  # a caller speech edge this close after a step's start still belongs before it


def caller_reference(caller: Sequence[Segment], at: float) -> float:
    """The end of the caller's last speech before `at` (or `at` when there was none)."""
    ends = [s.end for s in caller if s.start < at and s.end <= at + EDGE_SLACK]
    return max(ends) if ends else at


def agent_heard_at(agent: Sequence[Segment], since: float) -> float | None:
    """The first moment at or after `since` when the agent was speaking."""
    for segment in agent:
        if segment.end > since:
            return max(segment.start, since)
    return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def expect_speech(trace: StepTrace, caller: Sequence[Segment],
                  agent: Sequence[Segment]) -> CheckResult:
    within = float(trace.step.args.get("within", 1.5))
    reference = caller_reference(caller, trace.start)
    heard = agent_heard_at(agent, reference)
    name = trace.step.label
    if heard is None:
        return CheckResult(name, False, None, within, "s", f"no agent speech within {within:g} "
                           "s of the caller's speech ending", t=round(reference, 3))
    latency = round(heard - reference, 3)
    passed = latency <= within
    return CheckResult(name, passed, latency, within, "s",
                       f"agent speech {latency:.3f} s after the caller stopped "
                       f"({'≤' if passed else '>'} {within:g} s)", t=round(heard, 3))


def barge_in(trace: StepTrace, caller: Sequence[Segment],
             agent: Sequence[Segment]) -> CheckResult:
    limit_ms = float(trace.step.args.get("expect_stop_within_ms", 400))
    name = trace.step.label
    if trace.observed.get("no_speech"):
        wait = float(trace.step.args.get("wait_for_speech", 5.0))
        return CheckResult(name, False, None, limit_ms, "ms",
                           f"the agent did not speak within {wait:g} s, nothing to interrupt",
                           t=round(trace.start, 3))
    barge_at = float(trace.observed.get("barge_at", trace.start))
    talked = [s.start for s in caller if s.start >= barge_at - EDGE_SLACK]
    if not talked:
        return CheckResult(name, False, None, limit_ms, "ms",
                           "the caller's interruption was not heard as speech", t=barge_at)
    interrupt = talked[0]
    covering = [s for s in agent if s.start <= interrupt < s.end]
    if not covering:
        return CheckResult(name, True, 0.0, limit_ms, "ms", "the agent had already stopped "
                           "when the caller spoke", t=round(interrupt, 3))
    stop = covering[0].end
    end_of_audio = float(trace.observed.get("audio_end", float("inf")))
    if stop >= end_of_audio - 0.02:
        return CheckResult(name, False, None, limit_ms, "ms",
                           "the agent did not stop talking after the interruption",
                           t=round(interrupt, 3))
    stop_ms = _ms(stop - interrupt)
    passed = stop_ms <= limit_ms
    return CheckResult(name, passed, stop_ms, limit_ms, "ms",
                       f"the agent stopped {stop_ms:g} ms after the caller cut in "
                       f"({'≤' if passed else '>'} {limit_ms:g} ms)", t=round(stop, 3))


def _timed(trace: StepTrace, key: str, within: float, what: str) -> CheckResult:
    name = trace.step.label
    at = trace.observed.get(key)
    if at is None:
        return CheckResult(name, False, None, within, "s", f"no {what} within {within:g} s",
                           t=round(trace.start, 3))
    took = round(max(0.0, float(at) - trace.start), 3)
    passed = took <= within
    return CheckResult(name, passed, took, within, "s",
                       f"{what} after {took:.3f} s ({'≤' if passed else '>'} {within:g} s)",
                       t=round(float(at), 3))


def judge(traces: Sequence[StepTrace], caller: Sequence[Segment], agent: Sequence[Segment],
          audio_end: float) -> list[CheckResult]:
    """One check per expectation and per action that failed."""
    results: list[CheckResult] = []
    for trace in traces:
        kind = trace.step.kind
        args = trace.step.args
        if trace.error and kind != "expect_hangup":
            results.append(CheckResult(trace.step.label, False, None, None, "",
                                       trace.error, t=round(trace.start, 3)))
            continue
        if kind == "expect_speech":
            results.append(expect_speech(trace, caller, agent))
        elif kind == "barge_in":
            trace.observed.setdefault("audio_end", audio_end)
            results.append(barge_in(trace, caller, agent))
        elif kind == "expect_event":
            results.append(_timed(trace, "event_at", float(args.get("within", 5.0)),
                                  f"event {args['type']}"))
        elif kind == "expect_transcript":
            check = _timed(trace, "found_at", float(args.get("within", 5.0)),
                           f"transcript containing {args['contains']!r}")
            if not check.passed and "transcript" in trace.observed:
                check.message += f" (transcript: {trace.observed['transcript'][-80:]!r})"
            results.append(check)
        elif kind == "expect_hangup":
            results.append(_timed(trace, "ended_at", float(args.get("within", 10.0)),
                                  "the agent hung up"))
    return results


def basic(report: CallReport) -> list[CheckResult]:
    """What every call is held to: it connected, ran without error, and audio came back."""
    if not report.connected:
        why = f"[{report.error_code}] " if report.error_code else ""
        return [CheckResult("connected", False, None, None, "s",
                            f"not connected: {why}{report.error or 'unknown reason'}")]
    completed = CheckResult("call_completed", report.error is None, report.end_reason, None, "",
                            "the call ran as planned" if report.error is None else
                            f"[{report.error_code}] {report.error}")
    audio = CheckResult("audio_received", report.seconds_received > 0,
                        report.seconds_received, 0.0, "s",
                        f"{report.seconds_received:g} s of audio came back")
    return [CheckResult("connected", True, report.connect_seconds, None, "s", "connected"),
            completed, audio]
