"""Where an event loop's stalls come from, in every Python process started with this folder on
PYTHONPATH and AGENT_STALL_TRACE_DIR set (the server, its workers, the bench's callers):

    AGENT_STALL_TRACE_DIR=/tmp/stalls PYTHONPATH=benchmarks/stall_trace \\
        python benchmarks/workers_bench.py --transport rtp --workers 2 --levels 240
    python benchmarks/stall_trace/summary.py /tmp/stalls

The main thread's loop ticks a heartbeat every 5 ms. A watcher thread notices when it is
more than 30 ms late and, every 5 ms until it ticks again, samples the main thread: its
Python stack and its kernel state (R: running or waiting for a core; S/D: asleep, and in
which system call). Each stall is one line in `stall-PID.log` (wall-clock end, length, the
most frequent samples). A loop stuck in its own work shows Python frames in state R; one
starved of a core shows the same frames with the process's other samples idle; one waiting
on a lock or a disk shows S/D and the system call. The watcher's sampling adds a little
work during a stall only.
"""

from __future__ import annotations

import os

if os.environ.get("AGENT_STALL_TRACE_DIR"):
    import asyncio.base_events
    import collections
    import sys
    import threading
    import time
    import traceback

    HEARTBEAT_S = 0.005
    STALL_S = 0.03
    _last_beat = [time.monotonic()]
    _main = threading.main_thread()
    _run_forever = asyncio.base_events.BaseEventLoop.run_forever

    def _kernel_state(tid: int) -> str:
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/self/task/{tid}/syscall") as syscall:
                call = syscall.read().split()[0]
        except OSError:
            return "kernel state unknown"
        return f"state {state}" + ("" if call == "running" else f" in syscall {call}")

    def _schedstat(tid: int) -> tuple[int, int]:
        """(ns on a core, ns waiting for one) of a thread, as the kernel counts them."""
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                on_cpu, waiting, _ = stat.read().split()
        except (OSError, ValueError):
            return 0, 0
        return int(on_cpu), int(waiting)

    def _python_stack() -> str:
        frame = sys._current_frames().get(_main.ident or 0)
        if frame is None:
            return "no frame"
        return " < ".join(f"{entry.name}@{os.path.basename(entry.filename)}:{entry.lineno}"
                          for entry in reversed(traceback.extract_stack(frame)[-4:]))

    def _watch(folder: str) -> None:
        tid = _main.native_id or 0
        with open(os.path.join(folder, f"stall-{os.getpid()}.log"), "a", buffering=1) as log:
            samples: collections.Counter[str] = collections.Counter()
            began: float | None = None
            sched_before = (0, 0)
            while True:
                time.sleep(HEARTBEAT_S)
                if time.monotonic() - _last_beat[0] > STALL_S:
                    if began is None:
                        began = _last_beat[0]
                        sched_before = _schedstat(tid)
                    samples[_kernel_state(tid)] += 1
                    samples[_python_stack()] += 1
                elif began is not None:
                    on_cpu, waiting = (b - a for a, b in zip(sched_before, _schedstat(tid),
                                                             strict=True))
                    log.write(f"{time.time():.3f} stall {1000 * (time.monotonic() - began):.0f} ms"
                              f" {os.path.basename(sys.argv[0])} on-core {on_cpu / 1e6:.0f} ms"
                              f" runqueue {waiting / 1e6:.0f} ms\n")
                    for sample, count in samples.most_common(5):
                        log.write(f"    {count} {sample}\n")
                    samples.clear()
                    began = None

    _watcher: list[threading.Thread] = []

    def _traced_run_forever(self: asyncio.base_events.BaseEventLoop) -> None:
        if threading.current_thread() is _main:
            def beat() -> None:
                _last_beat[0] = time.monotonic()
                self.call_later(HEARTBEAT_S, beat)

            self.call_soon(beat)
            if not _watcher:  # one per process; every loop the main thread runs beats to it
                _watcher.append(threading.Thread(
                    target=_watch, args=(os.environ["AGENT_STALL_TRACE_DIR"],),
                    name="stall-trace", daemon=True))
                _watcher[0].start()
        return _run_forever(self)

    asyncio.base_events.BaseEventLoop.run_forever = _traced_run_forever  # type: ignore[method-assign]
