"""Device script: LM step time per tick at several batch sizes, eager and CUDA-graphed.

Builds a PersonaPlex-7B-shaped LM (dep_q 16, context 3000) with random bf16 weights directly
on the GPU, then for each batch size steps every slot with random user codes and prints the
median ms per tick of the eager step and of its CUDA-graph replay (`GraphedLMStep`), whether
the two gave identical tokens, and the peak GPU memory. Real time needs every tick of the
full step (Mimi encode + LM + Mimi decode) under 80 ms; this measures the LM part.

    python benchmarks/lm_gpu_bench.py [--batches 1 8 32 64] [--steps 30] [--layout personaplex]
    python benchmarks/lm_gpu_bench.py --device cpu --layout tiny --batches 1 4   # smoke run
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import torch

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_config import MOSHI_7B_LM_KWARGS, personaplex_7b_lm_kwargs
from agent.plugins.personaplex.lm_graph import GraphedLMStep
from agent.plugins.personaplex.lm_stepper import LMStepOutput, LMStepper

TINY: dict[str, Any] = {
    **MOSHI_7B_LM_KWARGS,
    "dim": 64,
    "num_heads": 4,
    "num_layers": 2,
    "context": 50,
    "text_card": 1000,
    "card": 256,
    "depformer_dim": 32,
    "depformer_num_heads": 4,
    "depformer_num_layers": 1,
    "depformer_dim_feedforward": 64,
    "dep_q": 16,
}


def layout(name: str, context: int | None) -> dict[str, Any]:
    kwargs = {
        "personaplex": personaplex_7b_lm_kwargs(),
        "moshi": dict(MOSHI_7B_LM_KWARGS),
        "tiny": dict(TINY),
    }[name]
    if context:
        kwargs["context"] = context
    return kwargs


def random_lm(kwargs: dict[str, Any], device: torch.device, dtype: torch.dtype) -> LMModel:
    """Random weights made on the device itself (no 16 GB host round trip)."""
    with torch.device("meta"):
        model = LMModel(**kwargs).to(dtype=dtype)
    model = model.to_empty(device=device).eval()
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("alpha", "norm.weight")) or ".norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                std = 1.0 / max(1, param.shape[-1]) ** 0.5
                param.normal_(0.0, std, generator=gen)
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(step: Any, codes: torch.Tensor, device: torch.device) -> tuple[float, list[tuple]]:
    times, tokens = [], []
    for t in range(codes.shape[-1]):
        sync(device)
        start = time.perf_counter()
        out: LMStepOutput = step(codes[:, :, t])
        sync(device)
        times.append((time.perf_counter() - start) * 1000)
        tokens.append((out.text_tokens.tolist(), out.audio_codes.tolist()))
    warm = times[3:] if len(times) > 6 else times
    return statistics.median(warm), tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--layout", choices=["personaplex", "moshi", "tiny"], default="personaplex")
    parser.add_argument(
        "--context", type=int, default=0, help="override the temporal context (frames)"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--no-graph", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    kwargs = layout(args.layout, args.context)
    started = time.perf_counter()
    lm = random_lm(kwargs, device, dtype)
    params = sum(p.numel() for p in lm.parameters()) / 1e9
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{name}, {args.layout} layout, {params:.2f} B params, {args.dtype}, "
        f"context {kwargs['context']}, "
        f"built in {time.perf_counter() - started:.1f} s"
    )
    use_graph = device.type == "cuda" and not args.no_graph
    header = f"{'B':>4} {'eager ms':>9} {'graph ms':>9} {'same tokens':>12} {'peak GiB':>9}"
    print(header)
    print("-" * len(header))
    for batch in args.batches:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        codes = torch.randint(0, kwargs["card"], (batch, 8, args.steps), device=device)
        stepper = LMStepper(lm, batch)
        eager_ms, eager_tokens = run(stepper.step, codes, device)
        graph_ms, same = float("nan"), "-"
        if use_graph:
            stepper.reset_slots(torch.ones(batch, dtype=torch.bool, device=device))
            graphed = GraphedLMStep(stepper)
            graph_ms, graph_tokens = run(graphed.step, codes, device)
            same = "yes" if graph_tokens == eager_tokens else "NO"
            del graphed
        peak = (
            torch.cuda.max_memory_allocated(device) / 2**30
            if device.type == "cuda"
            else float("nan")
        )
        print(f"{batch:>4} {eager_ms:>9.2f} {graph_ms:>9.2f} {same:>12} {peak:>9.1f}")
        streaming.stop_streaming(stepper)
        del stepper
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
