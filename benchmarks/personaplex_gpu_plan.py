"""GPU plan: ms per tick of the full batched step with PersonaPlex-7B-shaped random weights.

    python benchmarks/personaplex_gpu_plan.py [--batches 1 8 32 64] [--ticks 20]
        [--warmup 5] [--device cuda] [--dtype bfloat16] [--context N] [--tiny]

The LM (dim 4096, 32 layers, depformer 1024 x 6, dep_q 16, context 3000: about 8.4 B
parameters) is built on the meta device, materialised on the GPU and filled with random
values, so no checkpoint download is needed; Mimi is the standard architecture (float32) with
random weights. Each batch size gets a fresh `BatchedStepper` (the same code the plugin runs:
Mimi encode -> LM step -> Mimi decode, CUDA graphs unless --eager; the first warm-up tick
captures them), then ticks are timed with a device sync per tick.
The target is B=64 under 80 ms per tick on one H200-class GPU.

`--tiny` runs the same script with the tiny test config on CPU (float32), to check the script
itself where no GPU is available.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import numpy as np
import torch

from agent.plugins.personaplex import lm_config, mimi_config, streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.stepper import BatchedStepper
from agent.plugins.personaplex.tiny_checkpoint import lm_kwargs as tiny_lm_kwargs
from agent.plugins.personaplex.tiny_checkpoint import mimi_architecture

REAL_TIME_MS = 80.0
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def random_lm(
    kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int
) -> LMModel:
    """Build on meta, allocate on `device`, fill in place (no CPU copy of 17 GB of weights)."""
    with torch.device("meta"):
        model = LMModel(**kwargs)
    # Cast while still on meta (free), so the device only ever holds `dtype` weights.
    model = model.to(dtype).to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("alpha") or "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def frames_for(batch: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(1920) / 24000.0
    pitch = rng.uniform(100, 500, size=(count, batch, 1))
    return (0.3 * np.sin(2 * np.pi * pitch * t)).astype(np.float32)


def time_batch(lm: LMModel, mimi: torch.nn.Module, batch: int, ticks: int, warmup: int,
               device: torch.device, graphs: bool) -> dict[str, float]:
    stepper = BatchedStepper(lm, mimi, capacity=batch, graphs=graphs)
    handles = [stepper.acquire(None) for _ in range(batch)]
    frames = frames_for(batch, warmup + ticks, seed=batch)
    totals, lm_only = [], []
    try:
        for tick in range(warmup + ticks):
            sync(device)
            start = time.perf_counter()
            stepper.step(handles, frames[tick])
            sync(device)
            if tick >= warmup:
                totals.append((time.perf_counter() - start) * 1000)
        # The LM step alone (no codec), for the breakdown.
        user = torch.zeros(batch, lm.num_user_codebooks, dtype=torch.long, device=device)
        for _tick in range(min(ticks, 10)):
            sync(device)
            start = time.perf_counter()
            stepper._lm_forward(batch, user, None)
            sync(device)
            lm_only.append((time.perf_counter() - start) * 1000)
    finally:
        streaming.stop_streaming(stepper.lm_stepper)
        streaming.stop_streaming(mimi)
        del stepper, handles
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    totals.sort()
    return {
        "median": statistics.median(totals),
        "p90": totals[min(len(totals) - 1, int(0.9 * len(totals)))],
        "max": totals[-1],
        "lm": statistics.median(lm_only),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument(
        "--context", type=int, help="override the LM context (frames) to save memory"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="tiny config on CPU, to check the script"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eager", action="store_true", help="no CUDA graphs (the default on CUDA is graphs)"
    )
    args = parser.parse_args()

    if args.tiny:
        device, dtype = torch.device("cpu"), torch.float32
        kwargs = tiny_lm_kwargs("tiny", "personaplex", text_card=32000)
        mimi_arch: dict[str, Any] | None = mimi_architecture("tiny")
        torch.set_num_threads(1)
    else:
        device, dtype = torch.device(args.device), DTYPES[args.dtype]
        kwargs = lm_config.personaplex_7b_lm_kwargs()
        mimi_arch = None  # the standard Mimi
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
    if args.context:
        kwargs["context"] = args.context
    torch.manual_seed(args.seed)

    graphs = device.type == "cuda" and not args.eager
    start = time.perf_counter()
    lm = random_lm(kwargs, device, dtype, args.seed)
    mimi = mimi_config.build_mimi(mimi_arch, device, torch.float32)
    mimi.set_num_codebooks(lm.num_user_codebooks)
    sync(device)
    params = sum(p.numel() for p in lm.parameters()) / 1e9
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{name}: LM {params:.2f} B params ({dtype}), dim {kwargs['dim']}, "
        f"{kwargs['num_layers']} layers, "
        f"dep_q {kwargs['dep_q']}, context {kwargs['context']}; Mimi float32; "
        f"{'CUDA graphs' if graphs else 'eager'}; built in "
        f"{time.perf_counter() - start:.1f} s"
    )
    print(
        f"{'B':>4} {'median ms':>10} {'p90 ms':>8} {'max ms':>8} {'LM-only ms':>11} "
        f"{'< 80 ms':>8} {'peak GiB':>9}"
    )
    for batch in args.batches:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            result = time_batch(lm, mimi, batch, args.ticks, args.warmup, device, graphs)
        except torch.cuda.OutOfMemoryError:
            print(f"{batch:>4} out of GPU memory (try --context)")
            gc.collect()
            torch.cuda.empty_cache()
            continue
        peak = (
            torch.cuda.max_memory_allocated(device) / 2**30
            if device.type == "cuda"
            else float("nan")
        )
        ok = "yes" if result["p90"] < REAL_TIME_MS else "no"
        print(f"{batch:>4} {result['median']:10.1f} {result['p90']:8.1f} {result['max']:8.1f} "
              f"{result['lm']:11.1f} {ok:>8} {peak:9.1f}")


if __name__ == "__main__":
    main()
