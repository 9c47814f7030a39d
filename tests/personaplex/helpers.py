"""Shared by the PersonaPlex tests: a tiny LM config, a tiny checkpoint's models, test input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece
import torch

from agent.plugins.moshi_defaults import DEFAULT_PERSONA
from agent.plugins.personaplex import checkpoint, lm_config, mimi_config
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.mimi import MimiModel
from agent.plugins.personaplex.prompt import PromptPlan, VoicePrompt, persona_tokens

# A Moshi-layout LM (dep_q 8) small enough to step on CPU in milliseconds; a context of 8
# frames so slots at different positions all wrap the ring KV cache during a test.
TINY_LM_KWARGS: dict[str, Any] = dict(
    dim=32,
    text_card=50,
    n_q=16,
    dep_q=8,
    card=40,
    num_heads=4,
    num_layers=2,
    hidden_scale=4.125,
    context=8,
    gating="silu",
    norm="rms_norm_f32",
    positional_embedding="rope",
    depformer_dim=24,
    depformer_num_heads=4,
    depformer_num_layers=1,
    depformer_multi_linear=True,
    depformer_gating="silu",
    depformer_pos_emb="none",
    depformer_weights_per_step=True,
    delays=[0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
)


@dataclass
class TinyModels:
    files: checkpoint.CheckpointFiles
    lm: LMModel
    mimi: MimiModel
    tokenizer: Any

    def plan(
        self, voice: str | None = "NATF2.pt", persona: str | None = DEFAULT_PERSONA
    ) -> PromptPlan:
        voice_prompt = None
        if voice is not None:
            raw = self.files.load_voice(voice, torch.device("cpu"))
            voice_prompt = VoicePrompt(raw["embeddings"], raw["cache"])
        tokens = persona_tokens(self.tokenizer, persona) if persona is not None else ()
        return PromptPlan(voice=voice_prompt, text_tokens=tokens)


def load_tiny(model_dir: Path) -> TinyModels:
    files = checkpoint.inspect_checkpoint(model_dir, need_voices=True)
    info = lm_config.load_checkpoint_info(model_dir)
    lm = lm_config.load_lm(info, "cpu", torch.float32)
    mimi = mimi_config.load_mimi(files.mimi_weights, info.mimi_config, "cpu", torch.float32, 8)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files.tokenizer))
    return TinyModels(files, lm, mimi, tokenizer)


def speech_like_frames(seed: int, count: int, frame_size: int = 1920) -> np.ndarray:
    """Deterministic varied input: tones with a random pitch per frame plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(frame_size) / 24000.0
    frames = []
    for _ in range(count):
        pitch = rng.uniform(80, 600)
        amp = rng.uniform(0.0, 0.5)
        frames.append(amp * np.sin(2 * np.pi * pitch * t) + 0.05 * rng.standard_normal(frame_size))
    return np.asarray(frames, dtype=np.float32)
