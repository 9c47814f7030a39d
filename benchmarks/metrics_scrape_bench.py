"""How long a `GET /metrics` scrape takes while N calls are live (default 64).

A real `python -m signaling` (echo, pinned to core 0), N pre-encoded callers in a subprocess
(core 1), and scrapes from this process every 0.5 s; only scrapes that saw all N calls live
count. Prints one JSON line: calls, scrapes, median/p95/max milliseconds, response bytes, and
the median of a `/health/live` round trip taken right after (the loaded loop's own latency).

    python benchmarks/metrics_scrape_bench.py [--calls 64] [--seconds 25]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

from echo_bench import callers_subprocess, server


def active_calls(text: str) -> int:
    total = 0
    for line in text.splitlines():
        if line.startswith("agent_active_calls{"):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=25)
    args = parser.parse_args()
    with server("agent", ["--codecs", "PCMU"]) as url:
        reports: list[object] = []
        callers = threading.Thread(target=lambda: reports.extend(callers_subprocess(
            url, args.calls, args.seconds, "pcmu", True)))
        callers.start()
        times_ms: list[float] = []
        live_ms: list[float] = []
        size, peak = 0, 0
        while callers.is_alive():
            started = time.perf_counter()
            with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
                body = response.read()
            elapsed = (time.perf_counter() - started) * 1000
            live = active_calls(body.decode())
            peak = max(peak, live)
            # Baseline: the same round trip to a route that does nothing, so the figure
            # separates collection from the loaded event loop's own latency.
            started = time.perf_counter()
            with urllib.request.urlopen(url + "/health/live", timeout=10) as response:
                response.read()
            baseline = (time.perf_counter() - started) * 1000
            if live >= args.calls:
                times_ms.append(elapsed)
                live_ms.append(baseline)
                size = len(body)
            time.sleep(0.5)
        callers.join()
    ok = sum(1 for r in reports if isinstance(r, dict) and r.get("connected"))
    result = {"calls": args.calls, "connected": ok, "peak_live": peak,
              "scrapes_at_full": len(times_ms), "bytes": size}
    if times_ms:
        ordered = sorted(times_ms)
        result.update(median_ms=round(statistics.median(ordered), 2),
                      p95_ms=round(ordered[int(0.95 * (len(ordered) - 1))], 2),
                      max_ms=round(ordered[-1], 2),
                      health_live_median_ms=round(statistics.median(live_ms), 2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
