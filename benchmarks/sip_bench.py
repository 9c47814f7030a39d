"""SIP figures: call set-up under load, the set-up rate sipp sustains, established SIP echo
calls held in real time on one core, and memory per idle dialog.

    python benchmarks/sip_bench.py                       # everything, about a minute
    python benchmarks/sip_bench.py setup --rates 20,40,80,120 --seconds 5
    python benchmarks/sip_bench.py capacity --levels 100,200,300 --seconds 8
    python benchmarks/sip_bench.py memory --dialogs 200

The agent (echo plugin, auto-accept, `--sip-invite-rate 0`, no admission limit) runs pinned
to core 0; sipp and the callers run on core 1.

- **setup**: sipp (Debian `sip-tester`) places 1 s calls at each rate for `--seconds`; per
  rate the INVITE→200 time sipp measured (`-trace_rtt`, p50/p95) and its failed calls. The
  highest rate with 0 failed calls is the set-up rate sustained.
- **capacity**: N calls set up by a raw SIP client (INVITE, 200, ACK; PCMU), then every call
  streams the test signal as RTP in real time from one socket and records the echo, exactly
  as telephony_capacity_bench.py does for HTTP-created RTP legs (same pass criterion: every
  call answered, >= 99% of chunks and of echoed audio back, no gap over 60 ms after the
  first second, the echo correlated >= 0.9 with what was sent in every second), so the two
  compare directly. Beside each level, as there: the agent's CPU over the steady window only
  (every call up, before hang-up), the callers' and the foreign CPU over it, the frame-cost
  calibration and the load average; a failing level is tried once more (`--trials`).
- **memory**: the server's RSS before and with N answered, silent calls (each a dialog, an
  RTP leg and a plugin seat), per call.

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import (
    LEVEL_HEADER,
    MARKS,
    agent_command,
    capacity_levels,
    cpu_seconds,
    free_port,
    placed,
    server_on_core0,
)
from telephony_capacity_bench import (
    CHUNK,
    CoresWhile,
    SessionRecord,
    _caller_socket,
    _exchange_rtp,
    _loud_flags,
    _payloads,
    sent_pcm,
)

HOST = "127.0.0.1"


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextmanager
def sip_server(*flags: str) -> Iterator[tuple[int, int, int]]:
    """The agent with SIP on core 0: (HTTP port, SIP port, pid)."""
    port, sip_port = free_port(), free_udp_port()
    command = agent_command(port, "--sip-listen", f"{HOST}:{sip_port}", "--sip-invite-rate",
                            "0", "--rtp-ports", "42000-43999", "--idle-timeout", "60",
                            "--max-unauthenticated-per-address", "0", *flags)
    with server_on_core0(command, port) as pid:
        yield port, sip_port, pid


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


# -- set-up under load (sipp) ----------------------------------------------------------------


def sipp_scenario(media_port: int) -> str:
    offer = "\n".join(["v=0", "o=sipp 1 1 IN IP4 [local_ip]", "s=-", "c=IN IP4 [local_ip]",
                       "t=0 0", f"m=audio {media_port} RTP/AVP 0", "a=rtpmap:0 PCMU/8000"])
    common = """      Via: SIP/2.0/UDP [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      Call-ID: [call_id]
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Max-Forwards: 70"""
    return f"""<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="setup">
  <send retrans="500" start_rtd="true">
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
  <recv response="200" rtd="true" rrs="true"/>
  <send>
    <![CDATA[
      ACK [next_url] SIP/2.0
{common}
      To: <sip:agent@[remote_ip]:[remote_port]>[peer_tag_param]
      CSeq: 1 ACK
      Content-Length: 0
    ]]>
  </send>
  <pause milliseconds="1000"/>
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


def run_sipp_at(sip_port: int, rate: int, seconds: float, workdir: Path) -> dict[str, Any]:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("sipp is missing (apt-get install sip-tester)")
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # where the agent's RTP goes
    sink.bind((HOST, 0))
    scenario = workdir / f"setup_{rate}.xml"
    scenario.write_text(sipp_scenario(sink.getsockname()[1]))
    calls = max(1, int(rate * seconds))
    command = placed("1") + [
        sipp, f"{HOST}:{sip_port}", "-i", HOST, "-p", str(free_udp_port()), "-sf",
        str(scenario), "-r", str(rate), "-m", str(calls), "-l", str(rate * 4), "-nostdin",
        "-timeout", f"{seconds + 30:g}", "-timeout_error", "-trace_rtt", "-rtt_freq", "1",
        "-trace_stat", "-stf", str(workdir / f"stat_{rate}.csv")]
    try:
        result = subprocess.run(command, cwd=workdir, capture_output=True, text=True,
                                timeout=seconds + 60)
    finally:
        sink.close()
    times: list[float] = []
    for path in workdir.glob(f"setup_{rate}_*_rtt.csv"):
        with path.open() as source:
            for row in csv.reader(source, delimiter=";"):
                if len(row) >= 2 and row[1].replace(".", "", 1).isdigit():
                    times.append(float(row[1]))
    failed = None
    stat = workdir / f"stat_{rate}.csv"
    if stat.exists():
        rows = list(csv.reader(stat.open(), delimiter=";"))
        if len(rows) >= 2 and "FailedCall(C)" in rows[0]:
            failed = int(rows[-1][rows[0].index("FailedCall(C)")])
    return {"rate": rate, "calls": calls, "returncode": result.returncode, "failed": failed,
            "p50": percentile(times, 0.5), "p95": percentile(times, 0.95),
            "measured": len(times)}


def server_setup_times(port: int) -> dict[str, Any]:
    """The agent's own INVITE→200 figures (received to sent, ms) from /metrics/sip."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics/sip", timeout=10) as reply:
        stats = json.loads(reply.read())
    times = stats.get("invite_to_200_ms", {})
    return {"p50": times.get("p50"), "p95": times.get("p95")}


def bench_setup(rates: list[int], seconds: float) -> None:
    print(f"\n### SIP call set-up under load: sipp, 1 s calls for {seconds:g} s per rate, "
          "agent (echo, auto-accept) pinned to one core, a fresh server per rate\n")
    print("| calls/s | calls | failed | INVITE→200 p50 / p95 ms at sipp (4 ms steps) | "
          "in the agent p50 / p95 ms | server CPU % |")
    print("|---|---|---|---|---|---|")
    best = 0
    for rate in rates:
        with sip_server() as (port, sip_port, pid), tempfile.TemporaryDirectory() as tmp:
            before, started = cpu_seconds(pid), time.monotonic()
            row = run_sipp_at(sip_port, rate, seconds, Path(tmp))
            cpu = (cpu_seconds(pid) - before) / (time.monotonic() - started) * 100
            inside = server_setup_times(port)
        failed = row["failed"] if row["failed"] is not None else "?"
        ok = row["returncode"] == 0 and row["failed"] == 0
        print(f"| {rate} | {row['calls']} | {failed} | {row['p50']:.0f} / {row['p95']:.0f} | "
              f"{inside['p50']} / {inside['p95']} | {cpu:.0f} |", flush=True)
        if not ok:
            break
        best = rate
    print(f"| **{best}** | | **0 failed: the highest rate sustained** | | | |")


# -- a raw SIP caller (capacity and memory) --------------------------------------------------


class SipCaller(asyncio.DatagramProtocol):
    """INVITE/ACK/BYE by hand from one UDP socket; the answers by Call-ID."""

    def __init__(self, server: tuple[str, int], media: tuple[str, int]) -> None:
        self.server, self.media = server, media
        self.transport: asyncio.DatagramTransport | None = None
        self.waiting: dict[str, asyncio.Future[str]] = {}
        self.port = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.port = int(transport.get_extra_info("sockname")[1])

    def datagram_received(self, data: bytes, addr: tuple[Any, ...]) -> None:
        text = data.decode("utf-8", "replace")
        head = text.split("\r\n", 1)[0]
        if not head.startswith("SIP/2.0 "):
            return  # a request (the agent's BYE): not expected here
        status = int(head.split()[1])
        if status < 200:
            return
        call_id = next((line.split(":", 1)[1].strip() for line in text.split("\r\n")
                        if line.lower().startswith(("call-id:", "i:"))), "")
        future = self.waiting.pop(call_id, None)
        if future is not None and not future.done():
            future.set_result(text)

    def _send(self, text: str) -> None:
        assert self.transport is not None
        self.transport.sendto(text.encode(), self.server)

    def _headers(self, call_id: str, cseq: str, to_tag: str | None) -> str:
        tag = f";tag={to_tag}" if to_tag else ""
        host, port = self.server
        return (f"Via: SIP/2.0/UDP {HOST}:{self.port};branch=z9hG4bK{secrets.token_hex(6)}\r\n"
                f"From: <sip:bench@{HOST}:{self.port}>;tag=b{call_id[:8]}\r\n"
                f"To: <sip:agent@{host}:{port}>{tag}\r\nCall-ID: {call_id}\r\n"
                f"CSeq: {cseq}\r\nContact: <sip:bench@{HOST}:{self.port}>\r\n"
                "Max-Forwards: 70\r\n")

    async def call(self, timeout: float = 20.0) -> tuple[str, str, int]:
        """One answered call: (Call-ID, the agent's tag, its RTP port). Raises on failure."""
        call_id = secrets.token_hex(8)
        host, port = self.server
        sdp = (f"v=0\r\no=bench 1 1 IN IP4 {HOST}\r\ns=-\r\nc=IN IP4 {self.media[0]}\r\n"
               f"t=0 0\r\nm=audio {self.media[1]} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        self._send(f"INVITE sip:agent@{host}:{port} SIP/2.0\r\n"
                   + self._headers(call_id, "1 INVITE", None)
                   + f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n"
                   + sdp)
        answer = await asyncio.wait_for(future, timeout)
        if not answer.startswith("SIP/2.0 200"):
            raise RuntimeError(answer.split("\r\n", 1)[0])
        to_line = next(line for line in answer.split("\r\n") if line.lower().startswith("to:"))
        to_tag = to_line.split(";tag=", 1)[1].split(";")[0]
        media_port = int(next(line for line in answer.split("\r\n")
                              if line.startswith("m=audio")).split()[1])
        self._send(f"ACK sip:agent@{host}:{port} SIP/2.0\r\n"
                   + self._headers(call_id, "1 ACK", to_tag) + "Content-Length: 0\r\n\r\n")
        return call_id, to_tag, media_port

    async def hang_up(self, call_id: str, to_tag: str) -> None:
        host, port = self.server
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        self._send(f"BYE sip:agent@{host}:{port} SIP/2.0\r\n"
                   + self._headers(call_id, "2 BYE", to_tag) + "Content-Length: 0\r\n\r\n")
        try:
            await asyncio.wait_for(future, 10)
        except asyncio.TimeoutError:
            pass


async def open_caller(sip_port: int, media: tuple[str, int]) -> SipCaller:
    loop = asyncio.get_running_loop()
    _, caller = await loop.create_datagram_endpoint(
        lambda: SipCaller((HOST, sip_port), media), local_addr=(HOST, 0))
    return caller


async def place_calls(caller: SipCaller, count: int, per_second: float = 100.0
                      ) -> list[tuple[str, str, int] | BaseException]:
    async def one(index: int) -> tuple[str, str, int] | BaseException:
        await asyncio.sleep(index / per_second)
        try:
            return await caller.call()
        except Exception as exc:  # noqa: BLE001 - reported per call
            return exc

    return list(await asyncio.gather(*(one(i) for i in range(count))))


# -- capacity --------------------------------------------------------------------------------


async def run_sip_clients(sip_port: int, count: int, seconds: float) -> Any:
    from aiortc.rtp import RtpPacket

    payloads = _payloads(seconds)
    loud = _loud_flags(payloads)
    packets = [[RtpPacket(payload_type=0, sequence_number=n, timestamp=n * CHUNK,
                          ssrc=1000 + i, payload=payload).serialize()
                for n, payload in enumerate(payloads)] for i in range(count)]
    records = [SessionRecord() for _ in range(count)]
    sock = _caller_socket()
    caller = await open_caller(sip_port, sock.getsockname()[:2])
    calls = await place_calls(caller, count)
    live = [i for i, call in enumerate(calls) if isinstance(call, tuple)]
    for i, call in enumerate(calls):
        if isinstance(call, tuple):
            records[i].opened = True
        else:
            records[i].error = repr(call)
    destinations = [(HOST, calls[i][2]) for i in live]  # type: ignore[index]
    with CoresWhile() as sending:
        late_s = await asyncio.to_thread(_exchange_rtp, sock, [packets[i] for i in live],
                                         destinations, [records[i] for i in live])
    for i in live:
        records[i].sent_chunks = len(payloads)
        records[i].sent_loud = sum(loud)
    await asyncio.gather(*(caller.hang_up(calls[i][0], calls[i][1])  # type: ignore[index]
                           for i in live))
    sock.close()
    assert caller.transport is not None
    caller.transport.close()
    reference = sent_pcm(payloads)
    return ([record.summary(reference) for record in records],
            {"cores": sending.cores, "late_ms": late_s * 1000})


def bench_capacity(levels: list[int], seconds: float, trials: int = 2) -> None:
    print(f"\n### Established SIP echo calls (PCMU) in real time, agent pinned to one core, "
          f"{seconds:g} s each (compare telephony_capacity_bench.py --kinds rtp)\n")
    print(LEVEL_HEADER)

    @contextmanager
    def start(count: int) -> Iterator[tuple[list[str], int]]:
        with sip_server() as (_, sip_port, pid):
            yield placed("1") + [sys.executable, __file__, "clients", "--sip-port",
                                 str(sip_port), "--n", str(count), "--seconds",
                                 str(seconds)], pid

    capacity_levels("SIP", levels, trials, seconds, start)


# -- memory per idle dialog -------------------------------------------------------------------


async def measure_memory(sip_port: int, pid: int, count: int) -> tuple[float, float, int]:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind((HOST, 0))
    caller = await open_caller(sip_port, sink.getsockname()[:2])
    warm = await place_calls(caller, 5)  # first-call imports and pools out of the figure
    for call in warm:
        if isinstance(call, tuple):
            await caller.hang_up(call[0], call[1])
    await asyncio.sleep(1.0)
    before = rss_mib(pid)
    calls = await place_calls(caller, count)
    answered = [call for call in calls if isinstance(call, tuple)]
    await asyncio.sleep(2.0)
    during = rss_mib(pid)
    await asyncio.gather(*(caller.hang_up(call[0], call[1]) for call in answered))
    assert caller.transport is not None
    caller.transport.close()
    sink.close()
    return before, during, len(answered)


def bench_memory(count: int) -> None:
    print(f"\n### Memory per idle SIP dialog: {count} answered, silent calls (each a dialog, "
          "an RTP leg and a plugin seat)\n")
    print("| calls answered | RSS before MiB | RSS with them MiB | KiB per call |")
    print("|---|---|---|---|")
    with sip_server() as (_, sip_port, pid):
        before, during, answered = asyncio.run(measure_memory(sip_port, pid, count))
    per_call = (during - before) * 1024 / max(1, answered)
    print(f"| {answered} | {before:.1f} | {during:.1f} | {per_call:.0f} |")


def levels_of(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", nargs="?", default="all",
                        choices=["all", "setup", "capacity", "memory", "clients"])
    parser.add_argument("--rates", type=levels_of, default=[20, 40, 80])
    parser.add_argument("--levels", type=levels_of, default=[100, 200])
    parser.add_argument("--seconds", type=float, default=None,
                        help="per setup rate (default 4) or capacity level (default 6)")
    parser.add_argument("--dialogs", type=int, default=100)
    parser.add_argument("--trials", type=int, default=2,
                        help="capacity: tries per level (default 2: a failing level once more)")
    parser.add_argument("--sip-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.what == "clients":
        MARKS["print"] = True
        print(json.dumps(asyncio.run(run_sip_clients(args.sip_port, args.n, args.seconds))))
        return
    print(f"sip_bench on {os.cpu_count()} cores")
    if args.what in ("all", "setup"):
        bench_setup(args.rates, args.seconds or 4.0)
    if args.what in ("all", "capacity"):
        bench_capacity(args.levels, args.seconds or 6.0, max(1, args.trials))
    if args.what in ("all", "memory"):
        bench_memory(args.dialogs)


if __name__ == "__main__":
    main()
