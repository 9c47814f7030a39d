"""Read a checkpoint directory's config.json (as the reference `CheckpointInfo` does) and
build / load the LM from it.

config.json holds the LM keyword arguments at top level plus a few file names and options
that are not LM arguments (`moshi_name`, `mimi_name`, `tokenizer_name`, `mimi_config_name`,
`lm_gen_config`, `model_type`, ...). A directory without config.json is a legacy Moshi 7B
release, as in the reference. Nothing here downloads anything.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from agent.plugins.personaplex.lm import LMModel, agent_codebooks
from agent.plugins.personaplex.transformer import split_fused_attention

CONFIG_NAME = "config.json"
DEFAULT_MOSHI_NAME = "model.safetensors"
DEFAULT_MIMI_NAME = "tokenizer-e351c8d8-checkpoint125.safetensors"
DEFAULT_TOKENIZER_NAME = "tokenizer_spm_32k_3.model"

# The Moshi 7B temporal transformer + depformer (the reference's built-in default).
MOSHI_7B_LM_KWARGS: dict[str, Any] = {
    "dim": 4096,
    "text_card": 32000,
    "existing_text_padding_id": 3,
    "n_q": 16,
    "dep_q": 8,
    "card": 2048,
    "num_heads": 32,
    "num_layers": 32,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_dim_feedforward": int(4.125 * 1024),
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
}


def personaplex_7b_lm_kwargs() -> dict[str, Any]:
    """PersonaPlex 7B: the Moshi 7B layout with a 16-codebook depformer."""
    kwargs = copy.deepcopy(MOSHI_7B_LM_KWARGS)
    kwargs["dep_q"] = 16
    return kwargs


@dataclass
class CheckpointInfo:
    lm_kwargs: dict[str, Any]
    moshi_name: str
    mimi_name: str
    tokenizer_name: str
    mimi_config: dict[str, Any] | None
    lm_gen_config: dict[str, Any]
    model_type: str
    model_dir: Path
    mimi_config_name: str | None = None
    lora_name: str | None = None
    raw_config: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # tts_config, stt_config, model_id

    @property
    def moshi_path(self) -> Path:
        return self.model_dir / self.moshi_name

    @property
    def mimi_path(self) -> Path:
        return self.model_dir / self.mimi_name

    @property
    def tokenizer_path(self) -> Path:
        return self.model_dir / self.tokenizer_name

    @property
    def mimi_num_codebooks(self) -> int:
        """Codebooks the codec must produce for this LM: the larger of the agent and user
        streams (8 for Moshi and for PersonaPlex, whose dep_q=16 covers both streams; the
        reference rule max(dep_q, n_q - dep_q) would say 16 there)."""
        agent = agent_codebooks(self.lm_kwargs["n_q"], self.lm_kwargs["dep_q"])
        return max(agent, self.lm_kwargs["n_q"] - agent)


def _local_name(value: Any, key: str) -> str:
    """File names must stay inside the checkpoint directory (no hub or absolute paths)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"config.json: {key} must be a file name")
    if value.startswith("hf://"):
        raise ValueError(
            f"config.json: {key}={value!r} points to the hub; only local files are loaded"
        )
    name = value.removeprefix("file://")
    path = Path(name)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(
            f"config.json: {key}={value!r} must be a file inside the checkpoint directory"
        )
    return name


def load_checkpoint_info(model_dir: str | Path) -> CheckpointInfo:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory {model_dir} does not exist")
    config_path = model_dir / CONFIG_NAME
    if not config_path.exists():
        return CheckpointInfo(
            lm_kwargs=copy.deepcopy(MOSHI_7B_LM_KWARGS),
            moshi_name=DEFAULT_MOSHI_NAME,
            mimi_name=DEFAULT_MIMI_NAME,
            tokenizer_name=DEFAULT_TOKENIZER_NAME,
            mimi_config=None,
            lm_gen_config={},
            model_type="moshi",
            model_dir=model_dir,
        )
    try:
        raw = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{config_path} must hold a JSON object")
    lm_kwargs = dict(raw)
    moshi_name = _local_name(lm_kwargs.pop("moshi_name", DEFAULT_MOSHI_NAME), "moshi_name")
    mimi_name = _local_name(lm_kwargs.pop("mimi_name", DEFAULT_MIMI_NAME), "mimi_name")
    mimi_config_name = lm_kwargs.pop("mimi_config_name", None)
    tokenizer_name = _local_name(
        lm_kwargs.pop("tokenizer_name", DEFAULT_TOKENIZER_NAME), "tokenizer_name"
    )
    lora_name = lm_kwargs.pop("lora_name", None)
    model_type = lm_kwargs.pop("model_type", "moshi")
    lm_gen_config = lm_kwargs.pop("lm_gen_config", {})
    extra = {key: lm_kwargs.pop(key, {}) for key in ("tts_config", "stt_config", "model_id")}
    mimi_config = None
    if mimi_config_name is not None:
        mimi_config_name = _local_name(mimi_config_name, "mimi_config_name")
        mimi_config_path = model_dir / mimi_config_name
        try:
            mimi_config = json.loads(mimi_config_path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{mimi_config_path} (mimi_config_name in config.json) is missing"
            ) from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{mimi_config_path} is not valid JSON: {exc}") from exc
    return CheckpointInfo(
        lm_kwargs=lm_kwargs,
        moshi_name=moshi_name,
        mimi_name=mimi_name,
        tokenizer_name=tokenizer_name,
        mimi_config=mimi_config,
        lm_gen_config=lm_gen_config,
        model_type=model_type,
        model_dir=model_dir,
        mimi_config_name=mimi_config_name,
        lora_name=lora_name,
        raw_config=raw,
        extra=extra,
    )


def lm_constructor_kwargs(info: CheckpointInfo) -> dict[str, Any]:
    """The LMModel keyword arguments, normalised like the reference loader does."""
    kwargs = dict(info.lm_kwargs)
    kwargs.pop("depformer_causal", None)  # deprecated: the depformer is always causal
    if "demux_second_stream" in kwargs:
        kwargs["demux_second_text_stream"] = kwargs.pop("demux_second_stream")
    if kwargs.pop("lora", False) or info.lora_name:
        raise ValueError("LoRA checkpoints are not supported; merge the LoRA weights first")
    kwargs.pop("lora_rank", None)
    kwargs.pop("lora_scaling", None)
    # `"conditioners": {}` and `"fuser": null` describe an unconditioned LM, as the reference
    # loader reads them; real conditioning is refused.
    if kwargs.pop("conditioners", None) or kwargs.pop("fuser", None) is not None:
        raise ValueError("conditioned LMs (conditioners / fuser in config.json) are not supported")
    return kwargs


def build_lm(
    info: CheckpointInfo, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> LMModel:
    """An LMModel with this checkpoint's architecture and random weights."""
    try:
        model = LMModel(**lm_constructor_kwargs(info))
    except TypeError as exc:
        raise ValueError(
            f"config.json has LM options this implementation does not know: {exc}"
        ) from exc
    return model.to(device=device, dtype=dtype).eval()


def load_lm(
    info: CheckpointInfo, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> LMModel:
    """Build the LM on the meta device and assign the safetensors weights, read straight to
    `device` and cast to `dtype` (checkpoints are usually stored in bf16)."""
    path = info.moshi_path
    if not path.exists():
        raise FileNotFoundError(f"LM weights {path} are missing")
    with torch.device("meta"):
        model = build_lm(info, device="meta", dtype=dtype)
    state: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt", device=str(torch.device(device))) as handle:
        for key in handle.keys():
            tensor = handle.get_tensor(key)
            state[key] = tensor.to(dtype) if tensor.dtype.is_floating_point else tensor
    expected = {key: tensor.shape for key, tensor in model.state_dict().items()}
    fill_missing_depformer_steps(state, expected)
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as exc:
        raise ValueError(f"{path} does not match config.json: {str(exc)[:2000]}") from exc
    return model.eval()


def fill_missing_depformer_steps(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Size]
) -> None:
    """PersonaPlex may ship depformer weights for the first 8 codebook steps only; its
    loader fills steps 8-15 from steps 0-7 (and leaves the embedding of agent codebook 7,
    an input of step 8 only, uninitialised). We do the same, with zeros for that embedding.
    Steps 8-15 predict user codebooks, which LMStepper never generates."""
    split_fused_attention(state, expected)
    # group -> how a key's index maps to its depformer step (depformer_emb[i] feeds step i + 1)
    groups = {
        "gating": 0,
        "linears": 0,
        "depformer_in": 0,
        "depformer_emb": 1,
        "in_projs": 0,
        "out_projs": 0,
    }
    reference = next(iter(state.values()), None)
    for key in sorted(expected.keys() - state.keys()):
        for group, step_shift in groups.items():
            marker = f"{group}."
            if marker not in key or not (key.startswith(marker) or f".{marker}" in key):
                continue
            head, tail = key.split(marker, 1)
            index_text, _, rest = tail.partition(".")
            if not index_text.isdigit() or int(index_text) + step_shift < 8:
                continue
            source = f"{head}{marker}{int(index_text) - 8}.{rest}"
            if int(index_text) >= 8 and source in state:
                state[key] = state[source]
            elif reference is not None and group == "depformer_emb":
                state[key] = torch.zeros(
                    expected[key], dtype=reference.dtype, device=reference.device
                )
            break


@dataclass(frozen=True)
class LMMemoryEstimate:
    """Device memory the LM needs: weights once, plus streaming state per session slot."""

    weight_bytes: int
    state_bytes_per_slot: int

    def total_bytes(self, slots: int) -> int:
        return self.weight_bytes + slots * self.state_bytes_per_slot


def estimate_lm_memory(
    info: CheckpointInfo, dtype: torch.dtype = torch.bfloat16
) -> LMMemoryEstimate:
    """Exact sizes from a weightless (meta device) build: parameters in `dtype`, and every
    streaming tensor of one slot (KV caches of `context` frames, token ring, positions)."""
    from agent.plugins.personaplex import streaming
    from agent.plugins.personaplex.lm_stepper import LMStepper

    with torch.device("meta"):
        model = build_lm(info, device="meta", dtype=dtype)
        stepper = LMStepper(model, 1)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(
        value.numel() * value.element_size()
        for _, module in streaming.streaming_modules(stepper)
        for value in (module.state or {}).values()
    )
    return LMMemoryEstimate(weight_bytes=weight_bytes, state_bytes_per_slot=state_bytes)
