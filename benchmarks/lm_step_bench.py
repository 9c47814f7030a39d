"""Per-frame LM step time: our LMStepper vs the reference `LMGen.step` (if installed).

Random-weight Moshi-layout LMs (real vocabulary sizes: text 32000, audio 2048) of a tiny and a
small size are stepped greedily with random user codes at B=1 and B=8. Prints the median
milliseconds per tick of each, their ratio (ours / reference) and what B=8 costs relative to
B=1. The reference (`moshi==0.2.13`) is a test-only oracle; without it only our column shows.

    python benchmarks/lm_step_bench.py [--frames 40] [--threads 1] [--sizes tiny small]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # the reference would torch.compile on first use

import torch

from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_config import MOSHI_7B_LM_KWARGS
from agent.plugins.personaplex.lm_stepper import LMStepper

# The released 7B layout (Moshi's; PersonaPlex differs only in dep_q) without its sizes.
SIZE_KEYS = ("dim", "num_heads", "num_layers", "context", "depformer_dim",
             "depformer_num_heads", "depformer_num_layers", "depformer_context",
             "depformer_dim_feedforward")
BASE: dict[str, Any] = {key: value for key, value in MOSHI_7B_LM_KWARGS.items()
                        if key not in SIZE_KEYS}

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {**BASE, "dim": 64, "num_heads": 4, "num_layers": 2, "context": 100,
             "depformer_dim": 32, "depformer_num_heads": 4, "depformer_num_layers": 1},
    "small": {**BASE, "dim": 256, "num_heads": 8, "num_layers": 4, "context": 500,
              "depformer_dim": 128, "depformer_num_heads": 8, "depformer_num_layers": 2},
}


def median_ms(step: Callable[[torch.Tensor], Any], codes: torch.Tensor, warmup: int = 3) -> float:
    times = []
    for t in range(codes.shape[-1]):
        start = time.perf_counter()
        step(codes[:, :, t])
        if t >= warmup:
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def bench_ours(
    config: dict[str, Any], state: dict[str, torch.Tensor], codes: torch.Tensor
) -> float:
    model = LMModel(**config).eval()
    model.load_state_dict(state)
    stepper = LMStepper(model, codes.shape[0])
    return median_ms(stepper.step, codes)


def bench_reference(reference: Any, codes: torch.Tensor) -> float:
    from moshi.models.lm import LMGen

    gen = LMGen(reference, use_sampling=False)
    with torch.no_grad(), gen.streaming(codes.shape[0]):
        return median_ms(lambda c: gen.step(c[:, :, None]), codes)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        from moshi.models import lm as reference_lm
    except ImportError:
        reference_lm = None

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, frames {args.frames}")
    header = f"{'size':<6} {'B':>3} {'ours ms':>9} {'ref ms':>9} {'ours/ref':>9} {'ours B/B1':>10}"
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        config = SIZES[size]
        torch.manual_seed(0)
        if reference_lm is not None:
            reference = reference_lm.LMModel(**config).eval()
            state = reference.state_dict()
        else:
            reference = None
            state = LMModel(**config).state_dict()
        ours_b1 = None
        for batch in (1, 8):
            codes = torch.randint(
                0,
                config["card"],
                (batch, 8, args.frames),
                generator=torch.Generator().manual_seed(1),
            )
            ours = bench_ours(config, state, codes)
            ours_b1 = ours if batch == 1 else ours_b1
            ref = bench_reference(reference, codes) if reference is not None else float("nan")
            print(
                f"{size:<6} {batch:>3} {ours:>9.2f} {ref:>9.2f} {ours / ref:>9.2f} "
                f"{ours / ours_b1:>10.2f}"
            )


if __name__ == "__main__":
    main()
