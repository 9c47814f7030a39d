"""Our LM + LMStepper against the reference `moshi` LMModel / LMGen (test-only oracle).

Random-weight reference models are saved as a checkpoint directory (config.json +
model.safetensors), loaded back through our `lm_config.load_lm`, and stepped side by side.
"""

from __future__ import annotations

import os

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # keep torch.compile out of CPU tests

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from agent.plugins.personaplex.lm_config import load_checkpoint_info, load_lm
from agent.plugins.personaplex.lm_stepper import LMStepper
from tests.support.oracles import require as require_oracle

from .helpers import TINY_LM_KWARGS

pytestmark = pytest.mark.model

ref_lm = require_oracle("moshi.models.lm")

# The shared tiny layout, with every option the reference's constructor would otherwise
# default spelled out, and a two-layer depformer.
TINY: dict[str, Any] = {
    **TINY_LM_KWARGS,
    "existing_text_padding_id": 3, "causal": True, "layer_scale": None, "max_period": 10000,
    "depformer_dim_feedforward": int(4.125 * 24), "depformer_num_layers": 2,
    "depformer_layer_scale": None, "depformer_context": 8, "depformer_max_period": 10000,
}

# A second size exercising the other layout options a config may carry.
SMALL: dict[str, Any] = {
    **TINY,
    "dim": 64,
    "num_heads": 8,
    "num_layers": 3,
    "context": 40,
    "text_card": 80,
    "card": 64,
    "depformer_dim": 32,
    "depformer_dim_feedforward": 96,
    "depformer_weights_per_step_schedule": [0, 1, 1, 2, 2, 3, 3, 3],
    "depformer_low_rank_embeddings": 12,
    "depformer_norm": "rms_norm",
    "demux_second_text_stream": True,
    "text_card_out": 70,
}

# The tiny size with normalised embeddings, a LayerNorm transformer and the reference's
# default sinusoidal depformer positions.
TINY_LAYER_NORM: dict[str, Any] = {
    **TINY,
    "norm": "layer_norm",
    "norm_emb": True,
    "layer_scale": 0.1,
    "bias_proj": True,
    "depformer_pos_emb": "sin",
}


def write_checkpoint(
    directory: Path, config: dict[str, Any], seed: int, dtype: torch.dtype = torch.float32
) -> Any:
    """A reference LMModel with random weights, saved in the release layout."""
    torch.manual_seed(seed)
    reference = ref_lm.LMModel(**config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in reference.state_dict().items()}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "moshi"}))
    if dtype != torch.float32:
        reference.load_state_dict({k: v.float() for k, v in state.items()})
    return reference


def run_reference(reference: Any, user_codes: torch.Tensor) -> list[torch.Tensor | None]:
    batch, _, frames = user_codes.shape
    gen = ref_lm.LMGen(reference, use_sampling=False)
    outs: list[torch.Tensor | None] = []
    with torch.no_grad(), gen.streaming(batch):
        for t in range(frames):
            out = gen.step(user_codes[:, :, t : t + 1])
            outs.append(None if out is None else out[:, :, 0])
    return outs


def run_ours(stepper: LMStepper, user_codes: torch.Tensor) -> list[torch.Tensor | None]:
    outs: list[torch.Tensor | None] = []
    for t in range(user_codes.shape[-1]):
        step = stepper.step(user_codes[:, :, t])
        if not bool(step.audio_valid.any()):
            outs.append(None)
            continue
        assert bool(step.audio_valid.all())
        outs.append(torch.cat([step.aligned_text[:, None], step.audio_codes], dim=1))
    return outs


@pytest.mark.parametrize(
    ("config", "steps"),
    [(TINY, 52), (SMALL, 52), (TINY_LAYER_NORM, 30)],
    ids=["tiny", "small", "tiny-layer-norm"],
)
@pytest.mark.slow
def test_greedy_tokens_match_reference_lmgen(
    tmp_path: Path, config: dict[str, Any], steps: int
) -> None:
    reference = write_checkpoint(tmp_path / "ckpt", config, seed=0)
    ours = load_lm(load_checkpoint_info(tmp_path / "ckpt"), device="cpu", dtype=torch.float32)
    user_codes = torch.randint(
        0, config["card"], (2, 8, steps), generator=torch.Generator().manual_seed(1)
    )
    expected = run_reference(reference, user_codes)
    got = run_ours(LMStepper(ours, 2), user_codes)
    assert expected[0] is None and got[0] is None
    frames = [t for t in range(steps) if expected[t] is not None]
    assert len(frames) == steps - 1
    for t in frames:
        assert got[t] is not None
        assert torch.equal(got[t], expected[t]), (
            f"frame {t}: {got[t].tolist()} != {expected[t].tolist()}"
        )
    # The comparison means something only if the model really produces varied tokens.
    stacked = torch.stack([expected[t] for t in frames])
    assert len(torch.unique(stacked[:, :, 0])) > 3
    assert len(torch.unique(stacked[:, :, 1:])) > 10


def assert_same_tokens(expected: list[Any], got: list[Any]) -> None:
    """Frame by frame: no output where the reference has none, else the same tokens."""
    assert len(expected) == len(got)
    for e, g in zip(expected, got, strict=True):
        assert (e is None) == (g is None)
        if e is not None:
            assert torch.equal(g, e)


def test_bf16_checkpoint_computes_in_float32(tmp_path: Path) -> None:
    """Weights stored in bf16 (as released) load and compute in the requested dtype."""
    reference = write_checkpoint(tmp_path / "ckpt", TINY, seed=3, dtype=torch.bfloat16)
    ours = load_lm(load_checkpoint_info(tmp_path / "ckpt"), device="cpu", dtype=torch.float32)
    assert all(p.dtype == torch.float32 for p in ours.parameters())
    user_codes = torch.randint(
        0, TINY["card"], (1, 8, 20), generator=torch.Generator().manual_seed(4)
    )
    expected = run_reference(reference, user_codes)
    got = run_ours(LMStepper(ours, 1), user_codes)
    assert_same_tokens(expected, got)


def _personaplex_state(tmp_path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config = {**TINY, "dep_q": 16}
    reference = write_checkpoint(tmp_path / "pp", config, seed=5)
    return config, reference.state_dict()


def test_personaplex_layout_loads_without_missing_or_unexpected_keys(tmp_path: Path) -> None:
    config, reference_state = _personaplex_state(tmp_path)
    ours = load_lm(load_checkpoint_info(tmp_path / "pp"), device="cpu", dtype=torch.float32)
    assert ours.dep_q == 16 and ours.num_agent_codebooks == 8 and ours.num_user_codebooks == 8
    ours_state = ours.state_dict()
    assert set(ours_state) == set(reference_state)
    for key, value in reference_state.items():
        assert torch.equal(ours_state[key], value), key


def test_personaplex_layout_generates_like_reference_agent_depformer(tmp_path: Path) -> None:
    """With user codes fed in, a dep_q=16 model's agent tokens are those of the same weights
    cut to dep_q=8 run by the reference LMGen (the depformer is causal over codebooks, so the
    user-codebook steps cannot change the agent ones)."""
    config, state = _personaplex_state(tmp_path)
    moshi_config = {**config, "dep_q": 8}
    reference = ref_lm.LMModel(**moshi_config).eval()
    cut = {k: v for k, v in state.items() if k in reference.state_dict()}
    reference.load_state_dict(cut, strict=True)
    ours = load_lm(load_checkpoint_info(tmp_path / "pp"), device="cpu", dtype=torch.float32)
    user_codes = torch.randint(
        0, config["card"], (1, 8, 30), generator=torch.Generator().manual_seed(6)
    )
    expected = run_reference(reference, user_codes)
    got = run_ours(LMStepper(ours, 1), user_codes)
    assert_same_tokens(expected, got)


def test_personaplex_8_step_depformer_checkpoint_is_filled(tmp_path: Path) -> None:
    """A checkpoint with depformer weights for 8 steps (fused in_proj_weight, as released)
    loads into the dep_q=16 layout with steps 8-15 copied from 0-7."""
    config = {**TINY, "dep_q": 16}
    torch.manual_seed(7)
    small = ref_lm.LMModel(**{**config, "dep_q": 8}).eval()
    state = {}
    for key, value in small.state_dict().items():
        if ".self_attn.in_projs." in key or ".self_attn.out_projs." in key:
            continue
        state[key] = value.contiguous()
    for layer in range(config["depformer_num_layers"]):
        for kind, fused in (("in_projs", "in_proj_weight"), ("out_projs", "out_proj.weight")):
            parts = [
                small.state_dict()[f"depformer.layers.{layer}.self_attn.{kind}.{i}.weight"]
                for i in range(8)
            ]
            state[f"depformer.layers.{layer}.self_attn.{fused}"] = torch.cat(parts).contiguous()
    for layer in range(config["num_layers"]):
        state[f"transformer.layers.{layer}.self_attn.in_proj_weight"] = small.state_dict()[
            f"transformer.layers.{layer}.self_attn.in_projs.0.weight"
        ].contiguous()
        state[f"transformer.layers.{layer}.self_attn.out_proj.weight"] = small.state_dict()[
            f"transformer.layers.{layer}.self_attn.out_projs.0.weight"
        ].contiguous()
    directory = tmp_path / "pp8"
    directory.mkdir()
    save_file(state, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config))
    ours = load_lm(load_checkpoint_info(directory), device="cpu", dtype=torch.float32)
    ours_state = ours.state_dict()
    for key, value in small.state_dict().items():
        assert torch.equal(ours_state[key], value), key
    assert torch.equal(ours_state["linears.12.weight"], small.state_dict()["linears.4.weight"])
    assert torch.equal(
        ours_state["depformer_emb.9.weight"], small.state_dict()["depformer_emb.1.weight"]
    )
    assert not ours_state["depformer_emb.7.weight"].any()
    assert torch.equal(
        ours_state["depformer.layers.1.self_attn.in_projs.9.weight"],
        small.state_dict()["depformer.layers.1.self_attn.in_projs.1.weight"],
    )
