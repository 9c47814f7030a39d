"""CPU step time: this project's batched stepper vs the reference package (moshi==0.2.13).

    python benchmarks/personaplex_cpu_bench.py [--sizes tiny small] [--batches 1 8]
        [--ticks 30] [--threads 1]

For each size, one random-weight Moshi-layout checkpoint (dep_q 8, the layout the reference
`LMGen` can drive) is written; both implementations load the SAME files and run the same full
tick (Mimi encode of B frames -> LM step -> Mimi decode), greedy. Printed per (size, B):
median ms per tick for ours and the reference, their ratio (target <= 1.0 at B=1), and ours
at B over ours at B=1 (target <= 3 at B=8).

Then, on a PersonaPlex-layout checkpoint of the same size: the first prefill of a
(voice, persona) prompt (runs off the ticker), and the work an open call with a cached prompt
adds to the ticker (one slot copy), in ms and in ticks of the B=8 step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from agent.plugins.personaplex import lm_config, mimi_config
from agent.plugins.personaplex.checkpoint import inspect_checkpoint
from agent.plugins.personaplex.policy import DEFAULT_PERSONA
from agent.plugins.personaplex.prompt import PromptCache, PromptPlan, VoicePrompt, persona_tokens
from agent.plugins.personaplex.stepper import BatchedStepper
from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint

FRAME = 1920


def input_frames(batch: int, ticks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(FRAME) / 24000.0
    pitch = rng.uniform(100, 500, size=(ticks, batch, 1))
    return (
        0.3 * np.sin(2 * np.pi * pitch * t) + 0.02 * rng.standard_normal((ticks, batch, FRAME))
    ).astype(np.float32)


def load_ours(model_dir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    info = lm_config.load_checkpoint_info(model_dir)
    lm = lm_config.load_lm(info, "cpu", torch.float32)
    files = inspect_checkpoint(model_dir, need_voices=False)
    mimi = mimi_config.load_mimi(files.mimi_weights, info.mimi_config, "cpu", torch.float32, 8)
    return lm, mimi


class OursTicker:
    def __init__(self, model_dir: Path, batch: int) -> None:
        lm, mimi = load_ours(model_dir)
        self.stepper = BatchedStepper(lm, mimi, capacity=batch)
        self.handles = [self.stepper.acquire(None) for _ in range(batch)]

    def tick(self, frames: np.ndarray) -> None:
        self.stepper.step(self.handles, frames)


class ReferenceTicker:
    def __init__(self, model_dir: Path, batch: int) -> None:
        from moshi.models import loaders
        from moshi.models.lm import LMGen

        info = loaders.CheckpointInfo.from_hf_repo(
            "local/none",
            moshi_weights=model_dir / "model.safetensors",
            mimi_weights=model_dir / "tokenizer-e351c8d8-checkpoint125.safetensors",
            tokenizer=model_dir / "tokenizer_spm_32k_3.model",
            config_path=model_dir / "config.json",
            mimi_config_path=model_dir / "mimi_config.json",
        )
        self.mimi = info.get_mimi(device="cpu")
        self.generator = LMGen(
            info.get_moshi(device="cpu", dtype=torch.float32), use_sampling=False
        )
        self.mimi.streaming_forever(batch)
        self.generator.streaming_forever(batch)

    @torch.no_grad()
    def tick(self, frames: np.ndarray) -> None:
        codes = self.mimi.encode(torch.from_numpy(frames)[:, None])
        tokens = self.generator.step(codes[:, :8])
        if tokens is not None:
            self.mimi.decode(tokens[:, 1:9])


def time_both(
    model_dir: Path, batch: int, ticks: int, warmup: int, rounds: int = 3
) -> tuple[float, float]:
    """Median ms per tick, ours and the reference's, measured in alternating rounds so that a
    change in machine load hits both alike."""
    ours, ref = OursTicker(model_dir, batch), ReferenceTicker(model_dir, batch)
    frames = input_frames(batch, warmup + ticks * rounds)
    times: dict[str, list[float]] = {"ours": [], "ref": []}
    for ticker in (ours, ref):
        for tick in range(warmup):
            ticker.tick(frames[tick])
    per_round = ticks // rounds or 1
    for round_index in range(rounds):
        for name, ticker in (("ours", ours), ("ref", ref)):
            for tick in range(per_round):
                frame = frames[warmup + round_index * per_round + tick]
                start = time.perf_counter()
                ticker.tick(frame)
                times[name].append((time.perf_counter() - start) * 1000)
    return statistics.median(times["ours"]), statistics.median(times["ref"])


def open_call_cost(model_dir: Path, tick_ms: float) -> dict[str, float]:
    lm, mimi = load_ours(model_dir)
    files = inspect_checkpoint(model_dir, need_voices=True)
    import sentencepiece

    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files.tokenizer))

    def plan(voice: str | None, persona: str | None) -> PromptPlan:
        assert voice is not None and persona is not None
        raw = files.load_voice(voice, torch.device("cpu"))
        return PromptPlan(
            VoicePrompt(raw["embeddings"], raw["cache"]), persona_tokens(tokenizer, persona)
        )

    cache = PromptCache(lm, plan)
    stepper = BatchedStepper(lm, mimi, capacity=8)
    try:
        start = time.perf_counter()
        snapshot = cache.get_blocking(("NATF2.pt", DEFAULT_PERSONA))
        prefill_ms = (time.perf_counter() - start) * 1000
        frames_in_prompt = plan("NATF2.pt", DEFAULT_PERSONA).frames
        opens = []
        for _ in range(8):
            start = time.perf_counter()
            handle = stepper.acquire(snapshot)
            opens.append((time.perf_counter() - start) * 1000)
            stepper.release(handle)
    finally:
        cache.close()
    open_ms = statistics.median(opens)
    return {"prefill_ms": prefill_ms, "prompt_frames": frames_in_prompt, "open_ms": open_ms,
            "open_ticks": open_ms / tick_ms}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {args.ticks} ticks after "
        f"{args.warmup} warm-up"
    )
    print(f"{'size':6} {'B':>3} {'ours ms':>9} {'ref ms':>9} {'ours/ref':>9} {'ours B/B1':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            moshi_dir = write_checkpoint(Path(tmp) / f"{size}-moshi", size, "moshi", seed=0)
            base = None
            tick_b8 = None
            for batch in args.batches:
                ours, ref = time_both(moshi_dir, batch, args.ticks, args.warmup)
                base = base or ours
                if batch == 8:
                    tick_b8 = ours
                print(
                    f"{size:6} {batch:>3} {ours:9.2f} {ref:9.2f} {ours / ref:9.2f} "
                    f"{ours / base:10.2f}"
                )
            plex_dir = write_checkpoint(Path(tmp) / f"{size}-plex", size, "personaplex", seed=0)
            cost = open_call_cost(plex_dir, tick_b8 or base or 1.0)
            print(
                f"{size:6} prompt: {cost['prompt_frames']} frames prefilled in "
                f"{cost['prefill_ms']:.0f} ms "
                f"(once per voice+persona, off the ticker); open with cached prompt: "
                f"{cost['open_ms']:.2f} ms = {cost['open_ticks']:.3f} ticks of the B=8 step"
            )


if __name__ == "__main__":
    main()
