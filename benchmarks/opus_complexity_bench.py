"""What `--opus-complexity` trades: encoder CPU per 20 ms frame against how close the decoded
speech stays to the original, for the agent's outbound Opus (24 kHz mono, 48 kbit/s, the
encoder the agent itself runs).

    python benchmarks/opus_complexity_bench.py [--levels 0,5,8,10] [--repeats 5]

Speech is tests/fixtures/speech_16k.wav resampled to 24 kHz. The µs column is the median of
`--repeats` timed passes over the whole clip, one core, on the event-loop thread as in the
agent; the SNR is signal to coding noise (waveform, not perceptual: a lower complexity drops
analysis that mostly shapes noise where the ear does not hear it). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

from harness import ROOT

from agent.webrtc.encoding import OPUS_COMPLEXITY, PTIME
from tests.support.opus_quality import (
    decode_opus_at_24k,
    encode_opus,
    read_wav_at,
    snr_db,
)

RATE = 24000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default=",".join(str(n) for n in range(11)))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    speech = read_wav_at(ROOT / "tests" / "fixtures" / "speech_16k.wav", RATE)
    frames = len(speech) // int(RATE * PTIME)
    seconds = len(speech) / RATE
    print(f"speech: {seconds:.1f} s, {frames} frames of 20 ms; default complexity "
          f"{OPUS_COMPLEXITY}\n")
    print("| complexity | µs per 20 ms frame | kbit/s | SNR dB |")
    print("|---|---|---|---|")
    for complexity in (int(n) for n in args.levels.split(",")):
        timings = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            payloads = encode_opus(speech, RATE, complexity)
            timings.append((time.perf_counter() - started) / frames * 1e6)
        kbits = sum(len(p) for p in payloads) * 8 / seconds / 1000
        snr = snr_db(speech, decode_opus_at_24k(payloads), RATE)
        print(f"| {complexity} | {statistics.median(timings):.1f} | {kbits:.1f} | {snr:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
