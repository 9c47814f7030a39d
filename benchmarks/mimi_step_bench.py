"""Per-frame Mimi encode+decode time: this project vs the reference package (if installed).

Streams 1920-sample frames (one per slot per tick, as the stepper does) through random-weight
Mimi codecs of the tiny and small checkpoint sizes, at B=1 and B=8, and prints a table of the
median milliseconds per tick. The reference (`moshi==0.2.13`) is a test-only oracle; without
it only our column is printed.

    python benchmarks/mimi_step_bench.py [--frames 25] [--rounds 5] [--threads 1] \
        [--sizes tiny small standard]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from agent.plugins.personaplex.mimi_config import STANDARD_MIMI, build_mimi
from agent.plugins.personaplex.mimi_graph import GraphedMimi
from agent.plugins.personaplex.streaming import start_streaming
from agent.plugins.personaplex.tiny_checkpoint import mimi_architecture

FRAME = 1920
NUM_CODEBOOKS = 8
DEVICE = torch.device("cpu")
DTYPE = torch.float32
USE_GRAPH = False


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def time_ticks(step: Callable[[torch.Tensor], torch.Tensor], audio: torch.Tensor) -> float:
    """Median ms per tick over the frames of `audio` (one frame per slot per tick)."""
    times = []
    for t in range(audio.shape[-1] // FRAME):
        chunk = audio[..., t * FRAME : (t + 1) * FRAME]
        sync()
        start = time.perf_counter()
        step(chunk)
        sync()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def build_ours(config: dict, batch: int) -> Callable[[torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = build_mimi(config, DEVICE, DTYPE)
    model.set_num_codebooks(NUM_CODEBOOKS)
    start_streaming(model, batch)
    if USE_GRAPH:
        graphed = GraphedMimi(model)
        return lambda x: graphed.decode(graphed.encode(x))
    return lambda x: model.decode(model.encode(x))


def build_reference(config: dict, batch: int) -> Callable[[torch.Tensor], torch.Tensor] | None:
    try:
        from moshi.models import loaders
    except ImportError:
        return None
    torch.manual_seed(0)
    # The reference runs float32 (as its server does); on CUDA it captures CUDA graphs itself.
    model = loaders.get_mimi(
        None, copy.deepcopy(config), device=DEVICE, num_codebooks=NUM_CODEBOOKS
    )
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("embedding_sum"):
                buffer.copy_(torch.randn_like(buffer))
    model.streaming_forever(batch)
    return lambda x: model.decode(model.encode(x))


def measure(
    config: dict, batch: int, frames: int, rounds: int, skip_reference: bool
) -> tuple[float, float | None]:
    """Best-of-rounds median tick time; ours and the reference alternate round by round so
    that load from other processes hits both alike."""
    torch.manual_seed(1)
    audio = (torch.randn(batch, 1, FRAME * frames) * 0.3).to(DEVICE)
    ours_step, ref_step = (
        build_ours(config, batch),
        None if skip_reference else build_reference(config, batch),
    )
    ours_best, ref_best = float("inf"), float("inf")
    with torch.inference_mode():
        ours_step(audio[..., :FRAME].to(DTYPE))  # warm-up (allocator, first-call dispatch)
        if ref_step is not None:
            ref_step(audio[..., :FRAME])
        for _ in range(rounds):
            ours_best = min(ours_best, time_ticks(ours_step, audio.to(DTYPE)))
            if ref_step is not None:
                ref_best = min(ref_best, time_ticks(ref_step, audio))
    return ours_best, (ref_best if ref_step is not None else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=25, help="frames per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument(
        "--sizes",
        nargs="+",
        default=["tiny", "small"],
        help="tiny, small (checkpoint sizes) or standard (released Mimi)",
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu or cuda (GPU plan: --device cuda --dtype bfloat16 "
        "--graph --sizes standard --batches 1 8 32 64)",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-reference", action="store_true", help="time only this project's Mimi")
    parser.add_argument(
        "--graph", action="store_true", help="replay ours as CUDA graphs (GraphedMimi)"
    )
    args = parser.parse_args()
    global DEVICE, DTYPE, USE_GRAPH
    DEVICE, DTYPE, USE_GRAPH = torch.device(args.device), getattr(torch, args.dtype), args.graph
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.device} {args.dtype}{' graphed' if args.graph else ''} "
        f"(reference float32), "
        f"{torch.get_num_threads()} threads; "
        f"ms per tick (encode+decode of one 1920-sample frame per slot), "
        f"best of {args.rounds} rounds of the median over {args.frames} frames"
    )
    print(f"{'size':<6} {'B':>3} {'ours ms':>9} {'ref ms':>9} {'ours/ref':>9} {'ours/B1':>8}")
    for size in args.sizes:
        config = copy.deepcopy(STANDARD_MIMI) if size == "standard" else mimi_architecture(size)
        base: float | None = None
        for batch in args.batches:
            ours, ref = measure(config, batch, args.frames, args.rounds, args.no_reference)
            base = ours if base is None else base
            ratio = f"{ours / ref:9.2f}" if ref else f"{'-':>9}"
            ref_text = f"{ref:9.2f}" if ref else f"{'-':>9}"
            print(
                f"{size:<6} {batch:>3} {ours:9.2f} {ref_text} {ratio} {ours / base:8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
