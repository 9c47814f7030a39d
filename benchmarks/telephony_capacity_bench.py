"""Telephony capacity: concurrent real-time media-stream sessions and RTP legs on one core.

    python benchmarks/telephony_capacity_bench.py                 # both kinds, default levels
    python benchmarks/telephony_capacity_bench.py --kinds rtp --levels 20,40,80 --seconds 10

The agent (echo plugin) runs pinned to core 0 (`taskset -c 0`); the bridge clients run in
another process pinned to core 1. Each session streams the band-limited test signal as
μ-law in real time (20 ms / 160 bytes per message or packet) and records what comes back.
Same criterion as the WebRTC capacity benchmark: a level of N passes when every session
opened, no gap between received packets after the first second exceeded 60 ms, each session
received >= 99% of what could come back (the agent's 20 ms chunks over the time it was
sending, and >= 99% of the sent audio echoed back as audio, not silence), and its echo
carries what it sent: in every second, correlation >= 0.9 with the sent audio (packets can
flow on time while the echo is gone). Beside each level: the agent's CPU over the steady
window only (every session up, from the first second of media to the last chunk sent; not
the set-up or hang-up), the callers' own CPU and everything else's (foreign: /proc/stat's
busy time less agent and callers) over that window, the frame-cost calibration on the
agent's core just before the level (absolute capacities scale with it) and the load
average. A failing level is tried once more (`--trials`). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from harness import (
    LEVEL_HEADER,
    MARKS,
    ROOT,
    WINDOW_END,
    WINDOW_START,
    agent_command,
    capacity_levels,
    echo_correlations,
    free_port,
    level_passes,  # noqa: F401 - workers_bench judges its levels through this module
    mark_window,
    placed,
    server_on_core0,
)

PACKET_SECONDS = 0.02
CHUNK = 160
LOUD_RMS = 500.0  # int16; the test signal is about 8000 RMS, silence 0
TAIL_SECONDS = 0.6  # keep listening after the last chunk so its echo can come back


@contextmanager
def agent_server() -> Iterator[tuple[str, int]]:
    port = free_port()
    command = agent_command(port, "--rtp-ports", "42000-43999", "--idle-timeout", "30",
                            "--max-unauthenticated-per-address", "0")
    with server_on_core0(command, port) as pid:
        yield f"http://127.0.0.1:{port}", pid


# -- the client side (runs in its own process, on core 1) ----------------------------------


@dataclass
class SessionRecord:
    opened: bool = False
    error: str | None = None
    sent_chunks: int = 0
    sent_loud: int = 0
    received: int = 0
    arrivals: list[float] = field(default_factory=list)
    # What came back, judged loud or not after the run: the clients' per-packet work stays
    # small, so at high levels the clients do not take the CPU the server is measured on.
    received_payloads: list[bytes] = field(default_factory=list)
    # RTP: each received packet's timestamp, so the echo is laid out on the sender's clock.
    received_stamps: list[int] = field(default_factory=list)
    first_sent_at: float | None = None
    last_sent_at: float | None = None
    # When the caller's media began (on the arrivals' clock); None: at the first arrival. A
    # leg answers from the moment it opens, before its caller sends anything.
    media_from: float | None = None

    def count_sent(self, loud: bool, now: float) -> None:
        self.sent_chunks += 1
        self.sent_loud += loud
        self.first_sent_at = self.first_sent_at or now
        self.last_sent_at = now

    def heard(self, payload: bytes) -> None:
        self.received += 1
        self.arrivals.append(time.monotonic())
        self.received_payloads.append(payload)

    def echo(self) -> Any:
        """What came back from the first send on, as int16 PCM on the agent's clock: RTP
        payloads placed by timestamp (a lost packet stays silent), others in order."""
        import numpy as np

        from agent.telephony.g711 import mulaw_decode

        start = self.media_from if self.media_from is not None else self.first_sent_at
        chosen = [i for i, t in enumerate(self.arrivals) if start is None or t >= start]
        if not chosen:
            return np.zeros(0, dtype=np.int16)
        if len(self.received_stamps) != len(self.arrivals):
            return mulaw_decode(b"".join(self.received_payloads[i] for i in chosen))
        first = self.received_stamps[chosen[0]]
        offsets = [(self.received_stamps[i] - first) % (1 << 32) for i in chosen]
        keep = [(o, i) for o, i in zip(offsets, chosen, strict=True) if o < 1 << 22]
        out = np.zeros(max(o for o, _ in keep) + CHUNK, dtype=np.int16)
        for offset, i in keep:
            pcm = mulaw_decode(self.received_payloads[i])
            out[offset:offset + len(pcm)] = pcm[:len(out) - offset]
        return out

    def summary(self, sent_pcm: Any = None) -> dict[str, Any]:
        if not self.arrivals:
            return {"opened": self.opened, "error": self.error or "nothing received"}
        # The first second (sessions still being set up) is left out of both measures.
        start = (self.arrivals[0] if self.media_from is None else self.media_from) + 1.0
        later = [t for t in self.arrivals if t >= start]
        gaps = [b - a for a, b in zip(later, later[1:], strict=False)]
        window = later[-1] - later[0] + PACKET_SECONDS if later else PACKET_SECONDS
        return {
            "opened": self.opened, "error": self.error,
            "chunk_ratio": len(later) / (window / PACKET_SECONDS),
            "echo_ratio": sum(_loud_flags(self.received_payloads)) / max(1, self.sent_loud),
            "max_gap_ms": max(gaps, default=0.0) * 1000,
            "min_correlation": (min(echo_correlations(sent_pcm, self.echo()), default=0.0)
                                if sent_pcm is not None else 0.0),
        }


def _loud_flags(payloads: list[bytes]) -> list[bool]:
    """Which payloads carry audio rather than silence, judged for all at once (a numpy
    call per packet would cost the client process more than the run it judges)."""
    import numpy as np

    from agent.telephony.g711 import mulaw_decode

    sizes = np.array([len(p) for p in payloads], dtype=np.int64)
    flags = np.zeros(len(payloads), dtype=bool)
    filled = sizes > 0
    if filled.any():
        pcm = mulaw_decode(b"".join(payloads)).astype(np.float32)
        starts = np.concatenate(([0], np.cumsum(sizes[filled])[:-1]))
        energy = np.add.reduceat(pcm * pcm, starts)
        flags[filled] = np.sqrt(energy / sizes[filled]) > LOUD_RMS
    return flags.tolist()


def sent_pcm(payloads: list[bytes]) -> Any:
    """What the callers sent, as the agent decodes it (int16 PCM)."""
    from agent.telephony.g711 import mulaw_decode

    return mulaw_decode(b"".join(payloads))


def _payloads(seconds: float) -> list[bytes]:
    import numpy as np

    from agent.telephony.g711 import mulaw_encode
    from agent.testing.testsignal import make_test_signal

    pcm = (make_test_signal(seconds, 8000) * 32767).astype(np.int16)
    return [mulaw_encode(pcm[i:i + CHUNK]) for i in range(0, len(pcm) - CHUNK + 1, CHUNK)]


async def _pace(payload_count: int, send_all: Any) -> float:
    """One loop sends chunk i for every session at start + i * 20 ms (cheap for the client);
    how late, at worst, a chunk went out (s)."""
    started = time.monotonic()
    worst_late = 0.0
    for index in range(payload_count):
        if index == int(1 / PACKET_SECONDS):
            mark_window(WINDOW_START)
        worst_late = max(worst_late, time.monotonic() - started - index * PACKET_SECONDS)
        await send_all(index)
        delay = started + (index + 1) * PACKET_SECONDS - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    mark_window(WINDOW_END)
    return worst_late


class CoresWhile:
    """The client process's own CPU over a block, in cores: what the callers cost while the
    media flows, without their start-up and the judging after the run."""

    cores: float | None = None

    def __enter__(self) -> CoresWhile:
        self._cpu, self._wall = time.process_time(), time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cores = (time.process_time() - self._cpu) / max(1e-9, time.monotonic() - self._wall)


# What a clients process reports: every session's summary, and its own figures while sending:
# "cores" (its CPU) and "late_ms" (the worst lateness of a chunk it sent: a gap in what came
# back may start on this side).
ClientsRun = tuple[list[dict[str, Any]], dict[str, float | None]]


async def run_media_stream_clients(url: str, count: int, seconds: float) -> ClientsRun:
    import aiohttp

    payloads = _payloads(seconds)
    loud = _loud_flags(payloads)
    media = [json.dumps({"event": "media", "streamSid": "MZbench", "media": {
        "track": "inbound", "chunk": str(i + 1), "timestamp": str(i * 20),
        "payload": base64.b64encode(p).decode("ascii")}}) for i, p in enumerate(payloads)]
    records = [SessionRecord() for _ in range(count)]
    sockets: list[Any] = [None] * count

    # No connection limit: aiohttp's default of 100 would queue the 101st session forever.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def read(index: int) -> None:
            record, ws = records[index], sockets[index]
            async for message in ws:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = json.loads(message.data)
                if event.get("event") == "media":
                    record.heard(base64.b64decode(event["media"]["payload"]))

        async def open_one(index: int) -> None:
            try:
                ws = await http.ws_connect(url + "/v1/telephony/media-stream")
                await ws.send_str(json.dumps({"event": "connected", "protocol": "Call"}))
                await ws.send_str(json.dumps({"event": "start", "streamSid": "MZbench", "start": {
                    "streamSid": "MZbench", "callSid": f"CA{index}",
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000,
                                    "channels": 1}, "customParameters": {}}}))
                sockets[index] = ws
                records[index].opened = True
            except Exception as exc:  # noqa: BLE001 - reported per session
                records[index].error = repr(exc)

        await asyncio.gather(*(open_one(i) for i in range(count)))
        live = [i for i in range(count) if sockets[i] is not None]
        readers = [asyncio.ensure_future(read(i)) for i in live]

        async def send_all(chunk: int) -> None:
            now = time.monotonic()
            for i in live:
                record = records[i]
                try:
                    await sockets[i].send_str(media[chunk])
                except Exception as exc:  # noqa: BLE001
                    record.error = record.error or repr(exc)
                    continue
                record.count_sent(loud[chunk], now)

        with CoresWhile() as sending:
            late_s = await _pace(len(media), send_all)
            await asyncio.sleep(TAIL_SECONDS)
        stop = json.dumps({"event": "stop", "streamSid": "MZbench"})
        await asyncio.gather(*(sockets[i].send_str(stop) for i in live), return_exceptions=True)
        await asyncio.wait(readers, timeout=10)
        for reader in readers:
            reader.cancel()
        await asyncio.wait([asyncio.ensure_future(sockets[i].close()) for i in live], timeout=10)
    reference = sent_pcm(payloads)
    return ([record.summary(reference) for record in records],
            {"cores": sending.cores, "late_ms": late_s * 1000})


def rtp_payload(datagram: bytes) -> bytes:
    """The payload of an RTP packet with CSRCs and a header extension skipped (RFC 3550
    5.1, 5.3.1): cheaper per packet than a full parse."""
    offset = 12 + 4 * (datagram[0] & 0x0F)
    if datagram[0] & 0x10:
        offset += 4 + 4 * int.from_bytes(datagram[offset + 2:offset + 4], "big")
    return datagram[offset:]


# Linux socket options Python's socket module does not name (asm-generic/socket.h).
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # a buffer size beyond wmem_max/rmem_max (root)
SO_TIMESTAMPNS = 35  # each datagram's arrival time, in its ancillary data
READ_EVERY_S = 0.005  # the callers drain their socket this often (the kernel stamps arrivals)
SEND_PHASES = 4  # the callers' sends are spread over this many phases of each 20 ms


def _caller_socket() -> socket.socket:
    """The one UDP socket every leg's caller side sends from and hears on: one file
    descriptor to drain, with room for many ticks' echoes of hundreds of legs, and the
    kernel's arrival stamp on each datagram, so reading in batches keeps exact gaps."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for plain, forced in ((socket.SO_RCVBUF, SO_RCVBUFFORCE), (socket.SO_SNDBUF, SO_SNDBUFFORCE)):
        try:  # the forced size needs CAP_NET_ADMIN; the plain one is capped by r/wmem_max
            sock.setsockopt(socket.SOL_SOCKET, forced, 16 << 20)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, plain, 16 << 20)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    return sock


def _exchange_rtp(sock: socket.socket, packets: list[list[bytes]],
                  destinations: list[tuple[str, int]], records: list[SessionRecord]) -> float:
    """Send chunk n to leg i at start + n * 20 ms + (i mod 4) * 5 ms, and drain every echo
    every 5 ms, in one plain loop (no event loop, no wake-up per packet), so the callers cost
    the machine far less than the server they measure. The legs' sends are spread over four
    phases of the 20 ms, as a PBX's calls (started at random times) spread theirs, rather
    than every leg's packet landing on the server in the same instant. Arrival times are the
    kernel's (wall clock: only their differences count); datagrams are kept whole and judged
    after the run. Returns how late, at worst, a chunk went out (s)."""
    leg_of_source = {destination: index for index, destination in enumerate(destinations)}
    arrivals = [record.arrivals for record in records]
    datagrams = [record.received_payloads for record in records]
    stamp_space = socket.CMSG_SPACE(16)
    stamp = struct.Struct("qq").unpack
    chunks = len(packets[0]) if packets else 0
    phase_seconds = PACKET_SECONDS / SEND_PHASES
    phase_legs = [list(range(phase, len(destinations), SEND_PHASES))
                  for phase in range(SEND_PHASES)]
    started, media_from = time.monotonic(), time.time()  # the kernel's stamps: wall clock
    for record in records:
        record.media_from = media_from
    stop_at = started + chunks * PACKET_SECONDS + TAIL_SECONDS
    step, steps = 0, chunks * SEND_PHASES  # step: one phase's sends of one chunk
    window_from = min(steps, int(1 / PACKET_SECONDS) * SEND_PHASES)  # media's first second
    worst_late = 0.0
    while True:
        now = time.monotonic()
        while step < steps and now >= started + step * phase_seconds:
            worst_late = max(worst_late, now - started - step * phase_seconds)
            chunk, phase = divmod(step, SEND_PHASES)
            for index in phase_legs[phase]:
                try:
                    sock.sendto(packets[index][chunk], destinations[index])
                except OSError as exc:
                    records[index].error = records[index].error or repr(exc)
            step += 1
            if step == window_from:
                mark_window(WINDOW_START)
            if step == steps:
                mark_window(WINDOW_END)
        while True:
            try:
                datagram, ancillary, _, source = sock.recvmsg(2048, stamp_space)
            except BlockingIOError:
                break
            index = leg_of_source.get(source)
            if index is not None and ancillary:
                seconds, nanoseconds = stamp(ancillary[0][2])
                arrivals[index].append(seconds + nanoseconds * 1e-9)
                datagrams[index].append(datagram)
        if now >= stop_at:
            break
        next_send = started + step * phase_seconds if step < steps else stop_at
        time.sleep(max(0.0, min(next_send, stop_at, now + READ_EVERY_S) - time.monotonic()))
    for record in records:
        record.received = len(record.arrivals)
        record.received_stamps = [int.from_bytes(d[4:8], "big") for d in record.received_payloads]
        record.received_payloads = [rtp_payload(d) for d in record.received_payloads]
    return worst_late


async def run_rtp_clients(url: str, count: int, seconds: float) -> ClientsRun:
    import aiohttp
    from aiortc.rtp import RtpPacket

    payloads = _payloads(seconds)
    loud = _loud_flags(payloads)
    # Built before any leg opens: this is most of the callers' CPU, and the legs already
    # answering would share the machine with it.
    packets = [[RtpPacket(payload_type=0, sequence_number=n, timestamp=n * CHUNK,
                          ssrc=1000 + i, payload=payload).serialize()
                for n, payload in enumerate(payloads)] for i in range(count)]
    records = [SessionRecord() for _ in range(count)]
    sock = _caller_socket()
    host, port = sock.getsockname()[:2]
    destinations: list[tuple[str, int] | None] = [None] * count
    call_ids: list[str | None] = [None] * count
    # No connection limit: aiohttp's default of 100 would queue the 101st session forever.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async def open_one(index: int) -> None:
            try:
                async with http.post(url + "/v1/telephony/rtp", json={
                    "remote": f"{host}:{port}", "codec": "PCMU"}) as response:
                    body = await response.json()
                    if response.status != 201:
                        records[index].error = str(body)
                        return
                local_host, local_port = body["local"].rsplit(":", 1)
                destinations[index] = (local_host, int(local_port))
                call_ids[index] = body["call_id"]
                records[index].opened = True
            except Exception as exc:  # noqa: BLE001
                records[index].error = repr(exc)

        await asyncio.gather(*(open_one(i) for i in range(count)))
        live = [i for i in range(count) if destinations[i] is not None]
        with CoresWhile() as sending:
            late_s = await asyncio.to_thread(
                _exchange_rtp, sock, [packets[i] for i in live],
                [destinations[i] for i in live],  # type: ignore[misc]
                [records[i] for i in live])
        for i in live:
            records[i].sent_chunks = len(payloads)
            records[i].sent_loud = sum(loud)

        async def delete(call_id: str | None) -> None:
            async with http.delete(f"{url}/v1/telephony/rtp/{call_id}"):
                pass

        await asyncio.wait([asyncio.ensure_future(delete(call_ids[i])) for i in live], timeout=20)
    sock.close()
    reference = sent_pcm(payloads)
    return ([record.summary(reference) for record in records],
            {"cores": sending.cores, "late_ms": late_s * 1000})


def clients_command(kind: str, url: str, count: int, seconds: float,
                    core: str | None = "1", niceness: int = 0) -> list[str]:
    """The command of one client process for `count` sessions (pinned to `core`; None:
    anywhere; at `niceness`); it prints its steady window's edges, then its result."""
    return placed(core, niceness) + [sys.executable, __file__, "clients", "--kind", kind,
                                     "--url", url, "--n", str(count), "--seconds", str(seconds)]


def clients_subprocess(kind: str, url: str, count: int, seconds: float,
                       core: str | None = "1", niceness: int = 0) -> ClientsRun:
    """`count` sessions from one client process (pinned to `core`; None: anywhere; at
    `niceness`)."""
    command = clients_command(kind, url, count, seconds, core, niceness)
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                timeout=seconds * 3 + 90)
    except subprocess.TimeoutExpired:
        return ([{"opened": False, "error": "the clients did not finish in time"}],
                {"cores": None, "late_ms": None})
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    summaries, callers = json.loads(result.stdout.strip().splitlines()[-1])
    return summaries, callers


def bench(kinds: list[str], levels: list[int], seconds: float, trials: int) -> None:
    print(f"\n### Concurrent real-time telephony sessions, agent (echo plugin) pinned to one "
          f"core, {seconds:g} s each\n")
    print(LEVEL_HEADER)
    for kind in kinds:
        @contextmanager
        def start(count: int, kind: str = kind) -> Iterator[tuple[list[str], int]]:
            with agent_server() as (url, pid):
                yield clients_command(kind, url, count, seconds), pid

        capacity_levels(kind, levels, trials, seconds, start)


KINDS = ("media_stream", "rtp")


def session_kinds(text: str) -> list[str]:
    """`--kinds`: a comma-separated list of KINDS (`media-stream` is read as `media_stream`)."""
    kinds = [kind.strip().replace("-", "_") for kind in text.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(
            f"unknown session kind {', '.join(unknown) or '(none)'}: "
            f"choose from {', '.join(KINDS)}")
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    clients = sub.add_parser("clients", help="internal: run the bridge clients")
    clients.add_argument("--kind", choices=KINDS, required=True)
    clients.add_argument("--url", required=True)
    clients.add_argument("--n", type=int, required=True)
    clients.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--kinds", type=session_kinds, default="media_stream,rtp",
                        help=f"comma-separated, of {', '.join(KINDS)} (default both)")
    parser.add_argument("--levels", default="10,20,40,60,80,100,130,160,200")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--trials", type=int, default=2,
                        help="tries per level before it counts as failed (default 2: a "
                             "failing level is tried once more)")
    args = parser.parse_args()
    if args.command == "clients":
        MARKS["print"] = True
        runner = run_media_stream_clients if args.kind == "media_stream" else run_rtp_clients
        print(json.dumps(asyncio.run(runner(args.url, args.n, args.seconds))))
        return
    bench(args.kinds, [int(n) for n in args.levels.split(",")], args.seconds,
          max(1, args.trials))


if __name__ == "__main__":
    main()
