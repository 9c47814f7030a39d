"""Write a random-weight checkpoint directory in the release layout.

    python -m agent.plugins.personaplex.tiny_checkpoint OUT_DIR --size tiny|small \
        [--layout personaplex|moshi] [--seed N]

The files are exactly what a release has (LM and Mimi safetensors, `config.json` with the LM
keyword arguments at top level, a Mimi architecture JSON, a SentencePiece model, `voices/`), so
tests and new users go through the real loading path on CPU. The weights come from OUR modules
built from the written configs, so writing is also a check that a config builds.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from safetensors.torch import save_file

if TYPE_CHECKING:
    from agent.plugins.personaplex.mimi import MimiModel
    from agent.plugins.personaplex.quantizer import VectorQuantization

LM_WEIGHTS_NAME = "model.safetensors"
MIMI_WEIGHTS_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"
MIMI_CONFIG_NAME = "mimi_config.json"
CONFIG_NAME = "config.json"
VOICES_DIR = "voices"
VOICE_NAMES = ("NATF2.pt", "NATM1.pt", "VARF0.pt")
# The prompt uses fixed silence/sine token ids up to 2008, so the audio card stays the real one.
AUDIO_CARD = 2048
DELAYS = [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1]
TOKEN_CACHE_FRAMES = 4  # max delay + 3, as in the voice prompt files

TOKENIZER_TRAINING_TEXT = (
    "<system> You are a wise and friendly teacher. <system>",
    "Answer questions or provide advice in a clear and engaging way.",
    "Hello, how are you doing today? I am doing well, thank you for asking.",
    "The weather is lovely and the birds are singing in the trees.",
    "Please tell me a story about a dragon who learned to bake bread.",
    "We can talk about science, history, music, cooking or anything you like.",
    "Numbers like one two three four five six seven eight nine ten.",
    "Good morning, good afternoon, good evening and good night.",
    "The quick brown fox jumps over the lazy dog; 0123456789!?",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG, said Zoe (quietly): 'yes' - \"no\".",
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "lm": {"dim": 32, "num_heads": 2, "num_layers": 1, "hidden_scale": 2, "context": 64,
               "depformer_dim": 16, "depformer_dim_feedforward": 32,
               "depformer_num_heads": 2, "depformer_num_layers": 1},
        "mimi": {"dimension": 32, "n_filters": 4, "num_heads": 2, "num_layers": 1,
                 "context": 32, "dim_feedforward": 64, "codebook_dim": 16, "n_q": 8},
        "vocab_size": 160,
        "voice_frames": 6,
    },
    "small": {
        "lm": {"dim": 128, "num_heads": 4, "num_layers": 2, "hidden_scale": 4.125,
               "context": 250, "depformer_dim": 64, "depformer_dim_feedforward": 264,
               "depformer_num_heads": 4, "depformer_num_layers": 2},
        "mimi": {"dimension": 64, "n_filters": 8, "num_heads": 4, "num_layers": 2,
                 "context": 100, "dim_feedforward": 256, "codebook_dim": 32, "n_q": 16},
        "vocab_size": 300,
        "voice_frames": 12,
    },
}


def mimi_architecture(size: str) -> dict[str, Any]:
    """A Mimi config in the reference `_mimi_config` format (frame rate and hop as released)."""
    spec = SIZES[size]["mimi"]
    seanet = {
        "channels": 1, "dimension": spec["dimension"], "causal": True,
        "n_filters": spec["n_filters"], "n_residual_layers": 1, "activation": "ELU",
        "compress": 2, "dilation_base": 2, "disable_norm_outer_blocks": 0, "kernel_size": 7,
        "residual_kernel_size": 3, "last_kernel_size": 3, "norm": "none",
        "pad_mode": "constant", "ratios": [8, 6, 5, 4], "true_skip": True,
    }
    return {
        "sample_rate": 24000,
        "channels": 1,
        "frame_rate": 12.5,
        "seanet": seanet,
        "quantizer": {
            "dimension": spec["codebook_dim"], "n_q": spec["n_q"], "bins": AUDIO_CARD,
            "input_dimension": spec["dimension"], "output_dimension": spec["dimension"],
        },
        "transformer": {
            "d_model": spec["dimension"], "num_heads": spec["num_heads"],
            "num_layers": spec["num_layers"], "causal": True, "layer_scale": 0.01,
            "context": spec["context"], "conv_layout": True, "max_period": 10000,
            "gating": "none", "norm": "layer_norm", "positional_embedding": "rope",
            "dim_feedforward": spec["dim_feedforward"], "input_dimension": spec["dimension"],
            "output_dimensions": [spec["dimension"]],
        },
    }


def lm_kwargs(size: str, layout: str, text_card: int) -> dict[str, Any]:
    """LM keyword arguments as the reference LMModel takes them (the release's config.json)."""
    spec = SIZES[size]["lm"]
    dep_q = 16 if layout == "personaplex" else 8
    return {
        "dim": spec["dim"],
        "text_card": text_card,
        "existing_text_padding_id": 3,
        "n_q": 16,
        "dep_q": dep_q,
        "card": AUDIO_CARD,
        "num_heads": spec["num_heads"],
        "num_layers": spec["num_layers"],
        "hidden_scale": spec["hidden_scale"],
        "causal": True,
        "layer_scale": None,
        "context": spec["context"],
        "max_period": 10000,
        "gating": "silu",
        "norm": "rms_norm_f32",
        "positional_embedding": "rope",
        "depformer_dim": spec["depformer_dim"],
        "depformer_dim_feedforward": spec["depformer_dim_feedforward"],
        "depformer_num_heads": spec["depformer_num_heads"],
        "depformer_num_layers": spec["depformer_num_layers"],
        "depformer_layer_scale": None,
        "depformer_multi_linear": True,
        "depformer_context": dep_q,
        "depformer_max_period": 10000,
        "depformer_gating": "silu",
        "depformer_pos_emb": "none",
        "depformer_weights_per_step": True,
        "delays": list(DELAYS),
    }


def train_tokenizer(vocab_size: int) -> bytes:
    """A SentencePiece model trained in memory; id 0 unk, 3 pad (the text pad id)."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TOKENIZER_TRAINING_TEXT),
        model_writer=model,
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        model_type="unigram",
        character_coverage=1.0,
        unk_id=0, bos_id=1, eos_id=2, pad_id=3,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def _contiguous_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.detach().contiguous().clone() for key, value in module.state_dict().items()}


def fuse_attention(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our per-step attention keys → the released files' fused `in_proj_weight` and
    `out_proj.weight` (steps stacked in order), which NVIDIA's loader reads strictly."""
    fused: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        for split, name in ((".self_attn.in_projs.", "in_proj_weight"),
                            (".self_attn.out_projs.", "out_proj.weight")):
            if split in key and key.endswith(".weight"):
                stem, _, tail = key.partition(split)
                index = int(tail.split(".", 1)[0])
                parts.setdefault(f"{stem}.self_attn.{name}", {})[index] = value
                break
        else:
            fused[key] = value
    for key, pieces in parts.items():
        fused[key] = torch.cat([pieces[i] for i in sorted(pieces)]).contiguous()
    return fused


@torch.no_grad()
def calibrate_codebooks(mimi: MimiModel, generator: torch.Generator) -> None:
    """Spread each random codebook over the latents the random encoder actually produces.

    Unit-variance random centroids sit far from a random encoder's small latents, so every
    frame would map to the same code and the LM would see no difference between callers.
    Centroids drawn from each level's residual statistics give input-dependent codes."""
    seconds = 4
    t = torch.arange(24000 * seconds) / 24000.0
    pitch = 100 + 400 * torch.rand(4, 1, 1, generator=generator)
    audio = (0.3 * torch.sin(2 * torch.pi * pitch * t)
             + 0.05 * torch.randn(4, 1, t.numel(), generator=generator))
    latent = mimi.encode_latent(audio)
    for rvq in (mimi.quantizer.rvq_first, mimi.quantizer.rvq_rest):
        residual = rvq.input_proj(latent).transpose(1, 2).reshape(-1, rvq.dimension)
        for layer in rvq.vq.layers:
            codebook = cast("VectorQuantization", layer)._codebook
            mean, std = residual.mean(0), residual.std(0) + 1e-6
            centroids = mean + std * torch.randn(codebook.codebook_size, rvq.dimension,
                                                 generator=generator)
            codebook.cluster_usage.fill_(1.0)
            codebook.embedding_sum.copy_(centroids)
            nearest = torch.cdist(residual, centroids).argmin(-1)
            residual = residual - centroids[nearest]
        rvq.refresh_centroids()


def _voice_prompt(
    frames: int, dim: int, num_codebooks: int, text_pad: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    # bf16, as NVIDIA's voice files are saved from the bf16 model.
    embeddings = (torch.randn(frames, 1, 1, dim, generator=generator) * 0.5).to(torch.bfloat16)
    cache = torch.randint(0, AUDIO_CARD, (1, num_codebooks, TOKEN_CACHE_FRAMES),
                          generator=generator)
    cache[:, 0] = text_pad
    return {"embeddings": embeddings, "cache": cache}


def write_checkpoint(
    out_dir: str | Path, size: str = "tiny", layout: str = "personaplex", seed: int = 0
) -> Path:
    """Write the directory and return its path. Deterministic for a given (size, layout, seed)."""
    from agent.plugins.personaplex import lm_config, mimi_config

    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    if layout not in ("personaplex", "moshi"):
        raise ValueError(f"unknown layout {layout!r}; choose personaplex or moshi")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer_bytes = train_tokenizer(SIZES[size]["vocab_size"])
    (out / TOKENIZER_NAME).write_bytes(tokenizer_bytes)
    import sentencepiece

    text_card = sentencepiece.SentencePieceProcessor(model_proto=tokenizer_bytes).get_piece_size()

    mimi_arch = mimi_architecture(size)
    (out / MIMI_CONFIG_NAME).write_text(json.dumps(mimi_arch, indent=2))
    kwargs = lm_kwargs(size, layout, text_card)
    config = {
        **kwargs,
        "moshi_name": LM_WEIGHTS_NAME,
        "mimi_name": MIMI_WEIGHTS_NAME,
        "tokenizer_name": TOKENIZER_NAME,
        "mimi_config_name": MIMI_CONFIG_NAME,
        "model_type": "moshi",
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2))

    torch.manual_seed(seed)
    info = lm_config.load_checkpoint_info(out)
    lm = lm_config.build_lm(info, torch.device("cpu"), torch.float32)
    save_file(fuse_attention(_contiguous_state(lm)), str(out / LM_WEIGHTS_NAME))
    del lm
    mimi = mimi_config.build_mimi(mimi_arch, torch.device("cpu"), torch.float32)
    calibrate_codebooks(mimi, torch.Generator().manual_seed(seed + 2))
    save_file(fuse_attention(_contiguous_state(mimi)), str(out / MIMI_WEIGHTS_NAME))
    del mimi

    voices = out / VOICES_DIR
    voices.mkdir(exist_ok=True)
    generator = torch.Generator().manual_seed(seed + 1)
    for name in VOICE_NAMES:
        prompt = _voice_prompt(SIZES[size]["voice_frames"], kwargs["dim"], kwargs["n_q"] + 1,
                               kwargs["existing_text_padding_id"], generator)
        torch.save(prompt, voices / name)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agent.plugins.personaplex.tiny_checkpoint",
        description="Write a random-weight PersonaPlex/Moshi checkpoint directory.",
    )
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--layout", choices=("personaplex", "moshi"), default="personaplex")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = write_checkpoint(args.out_dir, args.size, args.layout, args.seed)
    print(f"wrote {args.size} {args.layout} checkpoint to {out}")


if __name__ == "__main__":
    main()
