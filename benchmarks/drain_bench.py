"""A drain run: N live calls at SIGTERM, offers during the drain, seconds to exit, lost audio.

A real `python -m signaling` (echo, core 0) with `--drain-seconds D`; N pre-encoded callers
(subprocess, core 1) of S seconds each, staggered 0.15 s. Once all are live the server gets
SIGTERM; this process then tries one offer every 0.5 s (each must be refused 503 `draining`)
until the server exits. A call "lost audio" if it did not complete or received less than
S - 0.5 s of audio. Prints one JSON line.

    python benchmarks/drain_bench.py [--calls 8] [--seconds 12] [--drain-seconds 30]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

from echo_bench import callers_subprocess
from harness import ROOT, agent_command, free_port, taskset, wait_for_port


def live_calls(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics/calls", timeout=10) as response:
        calls = json.loads(response.read())["calls"]
    return sum(1 for c in calls if c.get("connection_state") == "connected")


def try_offer(url: str) -> str:
    request = urllib.request.Request(url + "/v1/realtime/calls", data=b"v=0\r\n",
                                     headers={"Content-Type": "application/sdp"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.status)
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {json.loads(exc.read())['error']['code']}"
    except OSError:
        return "closed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--drain-seconds", type=float, default=30)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        taskset("0") + agent_command(port, "--ice-host", "127.0.0.1", "--codecs", "PCMU",
                                     "--max-unauthenticated-per-address", "0",
                                     "--drain-seconds", str(args.drain_seconds)),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        reports: list[dict[str, object]] = []
        callers = threading.Thread(target=lambda: reports.extend(callers_subprocess(
            url, args.calls, args.seconds, "pcmu", True)))
        callers.start()
        while live_calls(url) < args.calls:
            time.sleep(0.2)
        at_sigterm = live_calls(url)
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        answers: list[str] = []
        while process.poll() is None:
            answers.append(try_offer(url))
            time.sleep(0.5)
        exit_s = time.monotonic() - signalled
        callers.join()
    finally:
        if process.poll() is None:
            process.kill()
    lost = sum(1 for r in reports
               if not r.get("connected") or r.get("error")
               or float(r.get("seconds_received") or 0) < args.seconds - 0.5)
    print(json.dumps({
        "calls_at_sigterm": at_sigterm, "drain_seconds": args.drain_seconds,
        "offers_during_drain": sum(1 for a in answers if a != "closed"),
        "refused_draining": sum(1 for a in answers if a == "503 draining"),
        "other_answers": sorted({a for a in answers if a not in ("503 draining", "closed")}),
        "exit_status": process.returncode, "seconds_to_exit": round(exit_s, 2),
        "calls_lost_audio": lost,
    }))


if __name__ == "__main__":
    main()
