"""Mimi architecture: the standard config, parsing of a Mimi JSON, building and loading.

A checkpoint may name a Mimi architecture JSON (`mimi_config_name` in its config.json) in the
reference `_mimi_config` format:

    {"sample_rate": 24000, "channels": 1, "frame_rate": 12.5,
     "seanet": {SEANet kwargs, shared by encoder and decoder},
     "quantizer": {"dimension", "n_q", "bins", "input_dimension", "output_dimension", ...},
     "transformer": {ProjectedTransformer kwargs, used for both encoder and decoder sides}}

Without one, the standard Mimi below applies (values as the reference `loaders` module
defines them: SEANet 512-d, 64 filters, ratios [8, 6, 5, 4]; 8-layer 512-d transformers with
context 250; 32 codebooks of 2048 bins in 256-d).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from agent.plugins.base import PluginError
from agent.plugins.personaplex.conv import fold_weight_norm
from agent.plugins.personaplex.mimi import MimiModel
from agent.plugins.personaplex.quantizer import (
    SplitResidualVectorQuantizer,
    rename_legacy_codebook_keys,
)
from agent.plugins.personaplex.seanet import SEANetDecoder, SEANetEncoder
from agent.plugins.personaplex.transformer import split_fused_attention

SAMPLE_RATE = 24000
FRAME_RATE = 12.5

STANDARD_SEANET: dict[str, Any] = {
    "channels": 1,
    "dimension": 512,
    "causal": True,
    "n_filters": 64,
    "n_residual_layers": 1,
    "activation": "ELU",
    "compress": 2,
    "dilation_base": 2,
    "disable_norm_outer_blocks": 0,
    "kernel_size": 7,
    "residual_kernel_size": 3,
    "last_kernel_size": 3,
    # Trained with weight norm; the released weights have it folded in.
    "norm": "none",
    "pad_mode": "constant",
    "ratios": [8, 6, 5, 4],
    "true_skip": True,
}
STANDARD_QUANTIZER: dict[str, Any] = {
    "dimension": 256,
    "n_q": 32,
    "bins": 2048,
    "input_dimension": 512,
    "output_dimension": 512,
}
STANDARD_TRANSFORMER: dict[str, Any] = {
    "d_model": 512,
    "num_heads": 8,
    "num_layers": 8,
    "causal": True,
    "layer_scale": 0.01,
    "context": 250,
    "conv_layout": True,
    "max_period": 10000,
    "gating": "none",
    "norm": "layer_norm",
    "positional_embedding": "rope",
    "dim_feedforward": 2048,
    "input_dimension": 512,
    "output_dimensions": [512],
}
STANDARD_MIMI: dict[str, Any] = {
    "sample_rate": SAMPLE_RATE,
    "channels": 1,
    "frame_rate": FRAME_RATE,
    "seanet": STANDARD_SEANET,
    "quantizer": STANDARD_QUANTIZER,
    "transformer": STANDARD_TRANSFORMER,
}
# Codebooks the released LMs consume (the codec itself has 32).
DEFAULT_NUM_CODEBOOKS = 8


class MimiConfigError(PluginError, ValueError):
    """The Mimi architecture description cannot be served."""

    def __init__(self, message: str) -> None:
        super().__init__("mimi_config_invalid", message, status=500)


@dataclass(frozen=True)
class MimiConfig:
    sample_rate: int
    channels: int
    frame_rate: float
    seanet: dict[str, Any] = field(default_factory=dict)
    quantizer: dict[str, Any] = field(default_factory=dict)
    transformer: dict[str, Any] | None = None

    @property
    def frame_size(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sample_rate": self.sample_rate,
            "channels": self.channels,
            "frame_rate": self.frame_rate,
            "seanet": copy.deepcopy(self.seanet),
            "quantizer": copy.deepcopy(self.quantizer),
        }
        if self.transformer is not None:
            out["transformer"] = copy.deepcopy(self.transformer)
        return out


def standard_mimi_config() -> MimiConfig:
    return parse_mimi_config(STANDARD_MIMI)


def parse_mimi_config(raw: MimiConfig | dict[str, Any] | None) -> MimiConfig:
    """Validate a `_mimi_config`-format dict (None means the standard Mimi)."""
    if raw is None:
        raw = STANDARD_MIMI
    if isinstance(raw, MimiConfig):
        return raw
    if not isinstance(raw, dict):
        raise MimiConfigError(f"Mimi config must be a JSON object, got {type(raw).__name__}")
    for key in ("sample_rate", "channels", "frame_rate", "seanet", "quantizer"):
        if key not in raw:
            raise MimiConfigError(f"Mimi config is missing {key!r}")
    for key in ("seanet", "quantizer"):
        if not isinstance(raw[key], dict):
            raise MimiConfigError(f"Mimi config {key!r} must be an object")
    transformer = raw.get("transformer")
    if transformer is not None and not isinstance(transformer, dict):
        raise MimiConfigError("Mimi config 'transformer' must be an object")
    sample_rate, frame_rate = raw["sample_rate"], raw["frame_rate"]
    if not isinstance(sample_rate, int) or sample_rate <= 0:
        raise MimiConfigError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    if not isinstance(frame_rate, (int, float)) or frame_rate <= 0:
        raise MimiConfigError(f"frame_rate must be positive, got {frame_rate!r}")
    if sample_rate / frame_rate != int(sample_rate / frame_rate):
        raise MimiConfigError(f"sample_rate / frame_rate = {sample_rate / frame_rate} is not whole")
    channels = raw["channels"]
    if raw["seanet"].get("channels", channels) != channels:
        raise MimiConfigError("seanet.channels differs from channels")
    return MimiConfig(
        sample_rate=sample_rate,
        channels=int(channels),
        frame_rate=float(frame_rate),
        seanet=copy.deepcopy(raw["seanet"]),
        quantizer=copy.deepcopy(raw["quantizer"]),
        transformer=copy.deepcopy(transformer) if transformer is not None else None,
    )


def read_mimi_config(path: str | Path) -> MimiConfig:
    """Read a Mimi architecture JSON file."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise MimiConfigError(f"cannot read Mimi config {path}: {exc}") from exc
    return parse_mimi_config(raw)


def _build_transformer(
    kwargs: dict[str, Any], device: torch.device | str, dtype: torch.dtype
) -> torch.nn.Module:
    from agent.plugins.personaplex.transformer import ProjectedTransformer

    return ProjectedTransformer(device=device, dtype=dtype, **kwargs)


def build_mimi(
    mimi_config: MimiConfig | dict[str, Any] | None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> MimiModel:
    """A randomly initialised Mimi of the given architecture, in eval mode, on `device`/`dtype`.

    Codebook buffers stay float32 whatever `dtype`: nearest-centroid search is precision
    sensitive and the codebooks are small.
    """
    config = parse_mimi_config(mimi_config)
    try:
        # Built on the target device directly: no host-side init and copy of the weights.
        with torch.device(device):
            model = _assemble(config, device, dtype)
    except (TypeError, ValueError) as exc:
        raise MimiConfigError(f"invalid Mimi architecture: {exc}") from exc
    model.to(device=device, dtype=dtype)
    for name, buffer in model.quantizer.named_buffers():
        if name.endswith(("embedding_sum", "cluster_usage")):
            buffer.data = buffer.data.float()
    model.quantizer.refresh_centroids()
    return model.eval()


def _assemble(config: MimiConfig, device: torch.device | str, dtype: torch.dtype) -> MimiModel:
    # Same construction order as the reference, so a seed draws weights in the same sequence.
    encoder = SEANetEncoder(**config.seanet)
    decoder = SEANetDecoder(**config.seanet)
    encoder_transformer = decoder_transformer = None
    if config.transformer is not None:
        encoder_transformer = _build_transformer(config.transformer, device, dtype)
        decoder_transformer = _build_transformer(config.transformer, device, dtype)
    return MimiModel(
        encoder,
        decoder,
        SplitResidualVectorQuantizer(**config.quantizer),
        encoder_transformer,
        decoder_transformer,
        sample_rate=config.sample_rate,
        frame_rate=config.frame_rate,
        channels=config.channels,
    )


def load_mimi(
    path: str | Path,
    mimi_config: MimiConfig | dict[str, Any] | None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    num_codebooks: int = DEFAULT_NUM_CODEBOOKS,
) -> MimiModel:
    """Build Mimi and load a safetensors checkpoint (reference key layout) straight to `device`.

    Floating weights are cast to `dtype` (checkpoints may be stored in bf16); every key must
    match the module tree exactly.
    """
    model = build_mimi(mimi_config, device, dtype)
    state = read_safetensors(path, device)
    state = rename_legacy_codebook_keys(fold_weight_norm(state))
    expected = model.state_dict()
    # NVIDIA's release stores fused attention weights, which its loader reads strictly.
    split_fused_attention(state, {key: value.shape for key, value in expected.items()})
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise MimiConfigError(
            f"Mimi checkpoint {path} does not match the architecture: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''} "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
        )
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise MimiConfigError(
                f"Mimi checkpoint {path}: {key} has shape {list(value.shape)}, "
                f"the architecture needs {list(expected[key].shape)}"
            )
    # load_state_dict copies into the existing tensors, so each keeps its dtype (model dtype,
    # float32 codebooks) and no second full copy of the model is made.
    model.load_state_dict(state, strict=True)
    try:
        model.set_num_codebooks(num_codebooks)
    except ValueError as exc:
        raise MimiConfigError(f"the LM wants {num_codebooks} codebooks: {exc}") from exc
    return model


def read_safetensors(path: str | Path, device: torch.device | str) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            return {key: handle.get_tensor(key) for key in handle.keys()}
    except FileNotFoundError as exc:
        raise MimiConfigError(f"Mimi checkpoint not found: {path}") from exc
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise MimiConfigError(f"cannot read Mimi checkpoint {path}: {exc}") from exc
