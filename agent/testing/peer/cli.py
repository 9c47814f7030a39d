"""`python -m agent.peer URL`: the headless test peer's command line.

It calls an agent on any transport (`--transport webrtc|realtime|media-stream|rtp|sip`).
Without a script it plays a WAV (or the built-in test signal), records what comes back and
reports: connected, seconds sent/received, the round-trip delay of the test signal, gaps,
jitter. With `--script FILE` it runs a scripted conversation whose expectations are checks
with measured values. `--repeat N --concurrency M` makes a small load test with p50/p95 of
every figure. Outputs for CI: `--json [FILE]`, `--junit FILE`, `--record-dir DIR` (a stereo
WAV per call: caller left, agent right), `--timeline DIR` (a PNG per call). Exit status: 0
only when every check of every call passed; 2 for bad arguments (one line, before dialling);
1 otherwise, with one line on stderr per call that failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from agent.cli_errors import CliError, CliParser, exit_with_error
from agent.testing.peer import extra
from agent.testing.peer.own_load import OwnLoad
from agent.testing.peer.recording import PEER_RATE
from agent.testing.peer.report import CallReport, CheckResult, RunReport
from agent.testing.peer.transports.base import TRANSPORTS, PeerOptions
from agent.testing.peer.transports.urls import transport_of, url_problem
from agent.testing.peer.wav import read_audio_file

TAIL_SECONDS = 1.0  # after a --play file ends, long enough to hear its end come back


def build_parser() -> argparse.ArgumentParser:
    parser = CliParser(prog="python -m agent.peer", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="the agent: base URL (http://host:port) or an offer "
                        "endpoint; ws(s):// for media-stream, a host:port for rtp, a SIP URI "
                        "for sip")
    parser.add_argument("--transport", choices=list(TRANSPORTS), default=None,
                        help="how to call (default: the script's `transport`, else the one "
                        "the URL implies: sip for sip:, media-stream for ws(s)://, rtp for "
                        "rtp://; else webrtc)")
    parser.add_argument("--script", metavar="FILE",
                        help="a scripted conversation (YAML or JSON; schema: "
                        "agent/testing/peer/script_schema.json)")
    parser.add_argument("--play", help="WAV to send (default: the built-in test signal)")
    parser.add_argument("--record", help="write the received audio to this WAV (one call)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="call length without a script (default: the --play file's length "
                        "plus 1 s to hear its end come back, or 5 with the built-in signal)")
    parser.add_argument("--codec", choices=["opus", "pcmu", "pcma"], default=None,
                        help="the codec to offer (default: opus for WebRTC, pcmu for phones)")
    parser.add_argument("--session", help="session config JSON (voice, instructions, ...)")
    parser.add_argument("--token", help="Bearer token for the agent")
    parser.add_argument("--ice-host", action="append", default=None, metavar="ADDR",
                        help="gather ICE host candidates only on this address (repeatable)")
    parser.add_argument("--insecure", action="store_true",
                        help="accept any https certificate (a self-signed development server)")
    parser.add_argument("--sideband", action="store_true",
                        help="rtp/sip/media-stream: require the agent's sideband websocket "
                        "(GET /v1/realtime?call_id=ID) for server events; without it the peer "
                        "uses the sideband where the server offers one")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                        help="seconds to wait for the agent to answer (default 10)")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                        help="write the JSON report to FILE (alone: print it instead of the "
                        "text report; event types as counts)")
    parser.add_argument("--junit", metavar="FILE",
                        help="write JUnit XML: one testcase per check")
    parser.add_argument("--record-dir", metavar="DIR",
                        help="write a stereo WAV per call (caller left, agent right, from t0)")
    parser.add_argument("--timeline", metavar="DIR",
                        help="write a PNG timeline per call (needs the `peer` extra)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="place N calls (p50/p95 of every figure in the report)")
    parser.add_argument("--concurrency", type=int, default=1, metavar="M",
                        help="at most M calls at once")
    parser.add_argument("--pesq", choices=["auto", "nb", "wb", "off"], default=None,
                        help="PESQ of the echo against what was sent: narrowband (8 kHz), "
                        "wideband (16 kHz), by codec (auto), or off (default: auto for one "
                        "call, off with --repeat: it costs ~40 ms of CPU per second of call)")
    parser.add_argument("--min-pesq", type=float, default=None, metavar="MOS",
                        help="a check: PESQ at least MOS (meaningful against an echo)")
    return parser


def read_play_file(path: str) -> np.ndarray:
    return read_audio_file(path, f"--play {path}", "play")


def check_output_path(flag: str, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    code = "record_unwritable" if flag == "--record" else "output_unwritable"
    if not os.path.isdir(folder):
        raise CliError(code, f"{flag} {path}: folder {folder} does not exist")
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
        raise CliError(code, f"{flag} {path}: cannot write there")


def check_output_dir(flag: str, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CliError("output_unwritable", f"{flag} {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK):
        raise CliError("output_unwritable", f"{flag} {path}: cannot write there")


def parse_session(text: str) -> dict[str, Any]:
    try:
        session = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError("invalid_session", f"--session is not valid JSON ({exc.msg} at "
                       f"character {exc.pos})") from None
    if not isinstance(session, dict):
        raise CliError("invalid_session", "--session must be a JSON object, e.g. "
                       '\'{"voice": "NATF2.pt"}\'')
    return session


def event_counts(events: list[str]) -> dict[str, int]:
    """Event types in the order first seen, each with how often it came."""
    counts: dict[str, int] = {}
    for event in events:
        counts[event] = counts.get(event, 0) + 1
    return counts


def call_json(report: CallReport) -> dict[str, Any]:
    return {**report.to_json(), "events": event_counts(report.events)}


def run_json(run: RunReport) -> dict[str, Any]:
    """One call: its report (the shape the peer always printed); several: the run's."""
    if len(run.calls) == 1:
        return call_json(run.calls[0])
    body = run.to_json()
    body["calls"] = [call_json(call) for call in run.calls]
    return body


def _value(check: CheckResult) -> str:
    return "-" if check.value is None else f"{check.value}{check.unit}"


def print_report(run: RunReport) -> None:
    for index, report in enumerate(run.calls):
        prefix = f"call {index + 1}: " if len(run.calls) > 1 else ""
        status = "ok" if report.ok else "FAILED"
        print(f"{prefix}{status}  transport={report.transport} codec={report.codec} "
              f"connect={report.connect_seconds}s sent={report.seconds_sent}s "
              f"received={report.seconds_received}s delay={report.delay_ms}ms "
              f"corr={report.correlation} holes={report.holes} gaps={report.gaps} "
              f"jitter={report.jitter_ms}ms pesq={report.pesq}")
        for check in report.checks:
            mark = "pass" if check.passed else "FAIL"
            limit = "" if check.threshold is None else f" (threshold {check.threshold}" \
                f"{check.unit})"
            print(f"  {mark} {check.name}: {_value(check)}{limit} {check.message}")
    if len(run.calls) > 1:
        print(f"{sum(c.ok for c in run.calls)}/{len(run.calls)} calls passed in "
              f"{run.seconds:.1f} s (concurrency {run.concurrency})")
        for name, figures in run.aggregates().items():
            print(f"  {name}: p50={figures['p50']} p95={figures['p95']} n={figures['n']}")
        if run.own_load is not None:
            print(f"  {own_load_line(run.own_load)}")


def own_load_line(own: OwnLoad) -> str:
    per_call = own.cpu_per_call_second
    return (f"peer's own load: event loop {own.share:.0%} of a core "
            f"({own.busiest_share:.0%} at its busiest second), "
            + ("" if per_call is None else f"{per_call:.4f} CPU s per call-second, ")
            + f"send tick at most {own.tick_late_max_ms:.1f} ms late, "
            f"{own.analysis_cpu_seconds:.2f} CPU s measuring afterwards")


def report_failures(run: RunReport) -> None:
    """One line on stderr per call that failed, saying why; and one when the peer itself
    was busy enough to limit its calls."""
    warning = run.own_load.warning() if run.own_load is not None else None
    if warning is not None:
        print(f"warning [peer_busy]: {warning}", file=sys.stderr)
    for index, report in enumerate(run.calls):
        if report.ok:
            continue
        prefix = f"call {index + 1}: " if len(run.calls) > 1 else ""
        if report.error:
            print(f"{prefix}error [{report.error_code or 'call_failed'}]: {report.error}",
                  file=sys.stderr)
            continue
        failed = [c for c in report.checks if not c.passed]
        names = ", ".join(f"{c.name} ({_value(c)})" for c in failed) or "no audio came back"
        print(f"{prefix}failed checks: {names}", file=sys.stderr)


def add_pesq_checks(run: RunReport, minimum: float) -> None:
    for report in run.calls:
        passed = report.pesq is not None and report.pesq >= minimum
        why = (f"PESQ {report.pesq} ({report.pesq_mode})" if report.pesq is not None
               else f"no PESQ score ({report.pesq_error or 'no speech both ways'})")
        report.checks.append(CheckResult("pesq", passed, report.pesq, minimum, "",
                                         f"{why}, at least {minimum:g} expected"))


def write_outputs(args: argparse.Namespace, run: RunReport) -> None:
    """Every file asked for; a file that cannot be written is one more line on stderr."""
    jobs: list[tuple[str, Any]] = []
    if args.json and args.json != "-":
        jobs.append((f"--json {args.json}", lambda: _write_json(args.json, run)))
    if args.junit:
        from agent.testing.peer import junit

        jobs.append((f"--junit {args.junit}", lambda: junit.write(args.junit, run)))
    for flag, job in jobs:
        try:
            job()
        except OSError as exc:
            print(f"error [output_unwritable]: {flag}: {exc.strerror or exc}", file=sys.stderr)
            run.calls[0].error = run.calls[0].error or f"{flag}: {exc.strerror or exc}"


def _write_json(path: str, run: RunReport) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(run_json(run), out, indent=2)
        out.write("\n")


def write_refusal(args: argparse.Namespace, error: CliError) -> None:
    """The CI files for a run refused before dialling: one failed check saying why, so a
    pipeline that expects its test report finds one. Paths that are themselves the problem
    are skipped."""
    report = CallReport(error=error.message, error_code=error.code, url=args.url,
                        name=os.path.splitext(os.path.basename(args.script))[0]
                        if args.script else "call")
    report.checks = [CheckResult("arguments", False, None, None, "",
                                 f"[{error.code}] {error.message}")]
    run = RunReport([report])
    for flag, path in (("--json", args.json), ("--junit", args.junit)):
        if not path or path == "-":
            continue
        try:
            check_output_path(flag, path)
            if flag == "--json":
                _write_json(path, run)
            else:
                from agent.testing.peer import junit

                junit.write(path, run)
        except (CliError, OSError):
            continue


def prepare(args: argparse.Namespace) -> Any:
    """Every argument checked (and the script read) before dialling: a typo costs no call.
    A plain call needs nothing beyond the package; a feature of the `peer` extra is refused
    in one line when the extra is missing (extra.py)."""
    from agent.testing.peer.run import CallPlan

    if args.repeat < 1:
        raise CliError("invalid_repeat", "--repeat must be at least 1")
    if args.concurrency < 1:
        raise CliError("invalid_concurrency", "--concurrency must be at least 1")
    if args.script and args.play:
        raise CliError("invalid_arguments", "--script and --play do not go together (a "
                       "script plays its own audio: `- play: FILE.wav`)")
    if args.record and args.repeat > 1:
        raise CliError("invalid_arguments", "--record writes one call's audio; with --repeat "
                       "use --record-dir")
    extra.require_for(args)
    signal = read_play_file(args.play) if args.play else None
    script = None
    if args.script:
        from agent.testing.peer import script as scripts  # YAML and JSON Schema: the extra

        script = scripts.load(args.script)
    for flag in ("record", "junit"):
        if getattr(args, flag):
            check_output_path(f"--{flag}", getattr(args, flag))
    if args.json and args.json != "-":
        check_output_path("--json", args.json)
    for flag, folder in (("--record-dir", args.record_dir), ("--timeline", args.timeline)):
        if folder:
            check_output_dir(flag, folder)
    session = parse_session(args.session) if args.session else None
    if script is not None and script.session and session is None:
        session = script.session
    # The transport named, else the script's, else the one the URL implies (a sip: URL).
    transport = (args.transport or (script.transport if script else None)
                 or transport_of(args.url) or "webrtc")
    problem = url_problem(args.url, transport)
    if problem is not None:
        raise CliError("bad_url", problem)
    seconds = args.seconds
    if seconds is None:
        seconds = len(signal) / PEER_RATE + TAIL_SECONDS if signal is not None else 5.0
    # A load test of plain calls (--repeat/--concurrency without a script): nothing reads the
    # agent's audio while the calls run, so it is kept as packets and decoded after each call,
    # and the calls cost the peer as little as the transport allows.
    load_test = script is None and (args.repeat > 1 or args.concurrency > 1)
    options = PeerOptions(token=args.token, session=session, codec=args.codec,
                          ice_host=args.ice_host, insecure=args.insecure, timeout=args.timeout,
                          sideband=args.sideband,
                          extra={"defer_decoding": True} if load_test else {})
    return CallPlan(url=args.url, transport=transport, options=options, script=script,
                    signal=signal, seconds=seconds,
                    pesq=args.pesq or ("auto" if args.repeat == 1 or args.min_pesq is not None
                                       else "off"),
                    record_dir=args.record_dir, timeline_dir=args.timeline,
                    record_path=args.record)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        plan = prepare(args)
    except CliError as exc:
        write_refusal(args, exc)
        exit_with_error(exc.code, exc.message)
    from agent.testing.peer.run import run_calls

    run = asyncio.run(run_calls(plan, args.repeat, args.concurrency))
    if args.min_pesq is not None:
        add_pesq_checks(run, args.min_pesq)
    write_outputs(args, run)
    if args.json == "-":
        print(json.dumps(run_json(run), indent=2))
    else:
        print_report(run)
    report_failures(run)
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
