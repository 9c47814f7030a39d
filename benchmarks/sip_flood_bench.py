"""A SIP flood of every method while live SIP echo calls run: what the agent absorbs, how
many server transactions it keeps, its memory, and whether the calls' audio stays in time.

    python benchmarks/sip_flood_bench.py                      # 20 calls, 3 s per method
    python benchmarks/sip_flood_bench.py --calls 5 --seconds 2 --settle 0
    python benchmarks/sip_flood_bench.py --limits off         # no budget, no cap: as before
    python benchmarks/sip_flood_bench.py --rounds 2           # twice: memory reused, not grown

The agent (echo plugin, defaults of --sip-message-rate, --sip-max-transactions,
--sip-invite-rate 0 for sipp's calls) runs pinned to core 0. sipp places `--calls` PCMU
calls from 127.0.0.1 that play speech (espeak-ng, else speech-band noise) in a loop; their
SDP points the agent's echo at a receiver here, which notes when each packet of each call
arrives. Once the calls are up, a flooder process on 127.0.0.2 (core 1, beside sipp) sends
each kind of message at `--rate` a second (0: as fast as one Python process can, but
loopback then drops most in the kernel's backlog before the agent sees them: "read by
agent" is what reached it), `--seconds` each: OPTIONS,
REGISTER, MESSAGE, SUBSCRIBE, an unknown method, stray 200 responses, each request with a
fresh Call-ID and branch (a new transaction, not a retransmission). Meanwhile /metrics/sip
is read every 100 ms for the live server transaction count.

Prints a markdown table, one row per kind: messages sent a second, answers a second (by
status), dropped unanswered (by the budget and the transaction cap, from the agent's
counters; the rest of the difference was lost in the kernel's socket buffer), the peak live
server transactions, and the calls' worst echo gap while that kind flooded; then the
server's RSS before the flood, right after it, and `--settle` seconds later, and the calls'
result (sipp's exit status, calls whose echo arrived throughout).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from harness import cpu_seconds, placed
from sip_bench import HOST, free_udp_port, rss_mib, sip_server

FLOODER = "127.0.0.2"
KINDS = ("OPTIONS", "REGISTER", "MESSAGE", "SUBSCRIBE", "FROBNICATE", "response")
OFF = ["--sip-message-rate", "0", "--sip-max-transactions", "0"]


# -- the flooder (a process of its own) --------------------------------------------------------


def flood_template(kind: str, sip_port: int, port: int) -> str:
    method = "OPTIONS" if kind == "response" else kind
    head = ("SIP/2.0 200 OK" if kind == "response"
            else f"{method} sip:agent@{HOST}:{sip_port} SIP/2.0")
    return (f"{head}\r\n"
            f"Via: SIP/2.0/UDP {FLOODER}:{port};branch=z9hG4bK{{n}}x\r\n"
            f"Max-Forwards: 70\r\n"
            f"From: <sip:flood@{FLOODER}:{port}>;tag=f{{n}}\r\n"
            f"To: <sip:agent@{HOST}:{sip_port}>\r\n"
            f"Call-ID: flood-{{n}}@{FLOODER}\r\n"
            f"CSeq: 1 {method}\r\n"
            f"Contact: <sip:flood@{FLOODER}:{port}>\r\n"
            f"Content-Length: 0\r\n\r\n")


def flood(kind: str, sip_port: int, seconds: float, rate: float) -> dict[str, Any]:
    """Send `kind` to the agent for `seconds` at `rate` a second (0: as fast as possible);
    count what came back."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((FLOODER, 0))
    sock.setblocking(False)
    template = flood_template(kind, sip_port, sock.getsockname()[1])
    target = (HOST, sip_port)
    statuses: Counter[str] = Counter()
    sent = blocked = 0
    start = time.monotonic()
    end = start + seconds

    def read() -> None:
        while True:
            try:
                data = sock.recv(65535)
            except BlockingIOError:
                return
            statuses[data[8:11].decode(errors="replace")] += 1

    while (now := time.monotonic()) < end:
        if rate > 0 and sent >= (now - start) * rate:
            read()
            time.sleep(0.001)
            continue
        for _ in range(64):
            try:
                sock.sendto(template.replace("{n}", str(sent)).encode(), target)
                sent += 1
            except BlockingIOError:
                blocked += 1
                break
        read()
    deadline = time.monotonic() + 0.5  # late answers
    while time.monotonic() < deadline:
        read()
        time.sleep(0.01)
    sock.close()
    return {"kind": kind, "sent": sent, "blocked": blocked, "statuses": dict(statuses),
            "seconds": seconds}


# -- the live calls ---------------------------------------------------------------------------


def speech_wav(path: Path) -> None:
    """An 8 kHz μ-law WAV of speech (espeak-ng), else speech-band noise."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from agent.testing.testsignal import make_test_signal
    from tests.sip.helpers import write_mulaw_wav
    samples: np.ndarray | None = None
    espeak = shutil.which("espeak-ng")
    if espeak:
        raw = path.with_suffix(".raw.wav")
        subprocess.run([espeak, "-w", str(raw), "The quick brown fox jumps over the lazy dog. "
                        "Please hold while your call is being connected."], check=True)
        import wave
        with wave.open(str(raw)) as source:
            rate = source.getframerate()
            pcm = np.frombuffer(source.readframes(source.getnframes()),
                                dtype=np.int16).astype(np.float32) / 32768
        count = int(len(pcm) * 8000 / rate)
        samples = np.interp(np.arange(count) * rate / 8000, np.arange(len(pcm)), pcm)
    if samples is None:
        samples = make_test_signal(6.0, 8000)
    write_mulaw_wav(path, samples.astype(np.float32))


def call_scenario(media_port: int, wav: str, hold_ms: int) -> str:
    offer = "\n".join(["v=0", "o=sipp 1 1 IN IP4 [local_ip]", "s=-", "c=IN IP4 [local_ip]",
                       "t=0 0", f"m=audio {media_port} RTP/AVP 0", "a=rtpmap:0 PCMU/8000"])
    common = """      Via: SIP/2.0/UDP [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      Call-ID: [call_id]
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70"""
    return f"""<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="flood-live-call">
  <send retrans="500">
    <![CDATA[
      INVITE sip:agent@[remote_ip]:[remote_port] SIP/2.0
{common}
      To: <sip:agent@[remote_ip]:[remote_port]>
      CSeq: 1 INVITE
      Content-Type: application/sdp
      Content-Length: [len]

{offer}
    ]]>
  </send>
  <recv response="100" optional="true"/>
  <recv response="180" optional="true"/>
  <recv response="200" rrs="true"/>
  <send>
    <![CDATA[
      ACK [next_url] SIP/2.0
{common}
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      CSeq: 1 ACK
      Content-Length: 0
    ]]>
  </send>
  <nop><action><exec rtp_stream="{wav},-1,0"/></action></nop>
  <pause milliseconds="{hold_ms}"/>
  <send retrans="500">
    <![CDATA[
      BYE [next_url] SIP/2.0
{common}
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      CSeq: 2 BYE
      Content-Length: 0
    ]]>
  </send>
  <recv response="200" crlf="true"/>
</scenario>
"""


class EchoReceiver:
    """Where every call's echo goes: arrival times by SSRC, on a thread of its own."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((HOST, 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.arrivals: dict[int, list[float]] = defaultdict(list)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(2048)
            except TimeoutError:
                continue
            if len(data) >= 12:
                self.arrivals[int.from_bytes(data[8:12], "big")].append(time.monotonic())

    def worst_gap(self, start: float, end: float) -> float:
        """The longest silence of any call between `start` and `end`, seconds."""
        worst = 0.0
        for times in list(self.arrivals.values()):
            inside = [start, *(t for t in times if start < t < end), end]
            worst = max(worst, max(b - a for a, b in zip(inside, inside[1:], strict=False)))
        return worst

    def live_calls(self, start: float, end: float) -> int:
        return sum(1 for times in list(self.arrivals.values())
                   if any(start < t < start + 1 for t in times)
                   and any(end - 1 < t < end for t in times))

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


# -- the run -----------------------------------------------------------------------------------


def sip_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics/sip", timeout=5) as reply:
        data: dict[str, Any] = json.loads(reply.read())
    return data


class PeakWatch:
    """The most live server transactions /metrics/sip showed, read every 100 ms."""

    def __init__(self, port: int) -> None:
        self.port, self.peak, self._stop = port, 0, False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                live = int(sip_stats(self.port)["transactions"]["server"])
            except (OSError, KeyError, ValueError):
                live = 0
            self.peak = max(self.peak, live)
            time.sleep(0.1)

    def take(self) -> int:
        peak, self.peak = self.peak, 0
        return peak

    def close(self) -> None:
        self._stop = True
        self._thread.join()


def dropped(stats: dict[str, Any]) -> tuple[int, int]:
    """(messages the agent read, messages it dropped unanswered) so far."""
    budget = stats.get("budget", {})
    return (int(stats.get("counters", {}).get("messages_in", 0)),
            int(budget.get("messages_dropped", 0)) + int(budget.get("over_cap_dropped", 0)))


def run(calls: int, seconds: float, settle: float, limits: bool, rounds: int,
        rate: float) -> None:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is missing (apt-get install sip-tester)")
    hold_ms = int((rounds * len(KINDS) * (seconds + 3) + seconds + 12) * 1000)
    receiver = EchoReceiver()
    flags = [] if limits else OFF
    with tempfile.TemporaryDirectory() as tmp, sip_server(*flags) as (port, sip_port, pid):
        work = Path(tmp)
        speech_wav(work / "speech.wav")
        (work / "call.xml").write_text(call_scenario(receiver.port, "speech.wav", hold_ms))
        sipp_run = subprocess.Popen(placed("1") + [
            sipp, f"{HOST}:{sip_port}", "-i", HOST, "-p", str(free_udp_port()), "-sf",
            str(work / "call.xml"), "-m", str(calls), "-r", str(calls), "-l", str(calls),
            "-nostdin", "-timeout", f"{hold_ms / 1000 + 60:g}", "-timeout_error"],
            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while len(receiver.arrivals) < calls and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        quiet_start = time.monotonic()  # the calls' gaps without a flood, to compare
        time.sleep(seconds)
        baseline = receiver.worst_gap(quiet_start, time.monotonic())
        rss_before = rss_mib(pid)
        watch = PeakWatch(port)
        rows = []
        rss_rounds = []
        flood_start = time.monotonic()
        for kind in [kind for _ in range(rounds) for kind in KINDS]:
            before = dropped(sip_stats(port))
            begun, cpu_begun = time.monotonic(), cpu_seconds(pid)
            out = subprocess.run(placed("1") + [
                sys.executable, __file__, "_flood", kind, str(sip_port), str(seconds),
                str(rate)],
                capture_output=True, text=True, check=True)
            ended, cpu_ended = time.monotonic(), cpu_seconds(pid)
            result = json.loads(out.stdout)
            result["cpu"] = (cpu_ended - cpu_begun) / (ended - begun)
            stats = sip_stats(port)
            after = dropped(stats)
            result.update(peak=watch.take(), gap=receiver.worst_gap(begun, ended),
                          read=after[0] - before[0], dropped=after[1] - before[1])
            rows.append(result)
            if len(rows) % len(KINDS) == 0:
                rss_rounds.append(rss_mib(pid))
            time.sleep(1.0)
        flood_end = time.monotonic()
        watch.close()
        rss_after = rss_mib(pid)
        live_calls = receiver.live_calls(flood_start, flood_end)
        whole_gap = receiver.worst_gap(flood_start, flood_end)
        _, errors = sipp_run.communicate(timeout=hold_ms / 1000 + 90)
        time.sleep(max(0.0, settle - (time.monotonic() - flood_end)))
        rss_settled = rss_mib(pid)
        final = sip_stats(port)
    receiver.close()
    print(f"\n{calls} live SIP echo calls (sipp, PCMU speech), flood from {FLOODER} at "
          f"{rate:g}/s for {seconds:g} s per kind; limits {'on (defaults)' if limits else 'off'}\n")
    print("| kind | sent/s | read by agent/s | answered/s (status: count) | dropped unanswered "
          "by agent | peak live server transactions | agent CPU | calls' worst echo gap (ms) |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    print(f"| (no flood, {seconds:g} s before) | | | | | | | {baseline * 1000:.0f} |")
    for row in rows:
        answers = sum(row["statuses"].values())
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(row["statuses"].items()))
        print(f"| {row['kind']} | {row['sent'] / row['seconds']:,.0f} | "
              f"{row['read'] / row['seconds']:,.0f} | {answers / row['seconds']:,.0f} "
              f"({shown or 'none'}) | {row['dropped']:,} | "
              f"{row['peak']:,} | {row['cpu']:.0%} | {row['gap'] * 1000:.0f} |")
    if rounds > 1:
        print("\nRSS after each round: " + ", ".join(f"{rss:.1f}" for rss in rss_rounds)
              + " MiB")
    print(f"\nRSS: {rss_before:.1f} MiB before the flood, {rss_after:.1f} MiB right after, "
          f"{rss_settled:.1f} MiB {settle:g} s after it ended; live server transactions "
          f"then: {final['transactions']['server']}")
    print(f"calls: sipp exit {sipp_run.returncode} ({calls} calls), echo arriving through the "
          f"whole flood on {live_calls} of {calls}, worst gap of any call over the whole "
          f"flood {whole_gap * 1000:.0f} ms"
          + (f"; sipp said: {errors.strip()[-300:]}" if sipp_run.returncode else ""))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_flood":
        kind, sip_port, seconds = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        print(json.dumps(flood(kind, sip_port, seconds, float(sys.argv[5]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3.0, help="flood time per kind")
    parser.add_argument("--settle", type=float, default=60.0,
                        help="seconds after the flood for the last RSS reading")
    parser.add_argument("--rate", type=float, default=20000,
                        help="messages a second the flooder sends (0: as fast as it can; "
                        "loopback then drops most of them in the kernel, before the agent)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="floods of every kind in a row (RSS after each: no growth)")
    parser.add_argument("--limits", choices=("on", "off"), default="on",
                        help="off: --sip-message-rate 0 --sip-max-transactions 0 (as before)")
    args = parser.parse_args()
    run(args.calls, args.seconds, args.settle, args.limits == "on", args.rounds, args.rate)


if __name__ == "__main__":
    main()
