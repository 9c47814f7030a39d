"""Streaming transformer shared by the Mimi codec and the language model.

Module names and parameter shapes follow the reference (`moshi.modules.transformer`) so a
released state dict loads unchanged. What differs is the streaming state: every slot of the
batch carries its own position (`offset`), and each attention layer keeps a per-slot ring KV
cache of `context` entries. A slot can therefore join at any frame; the attention mask is built
from the slot's own positions, so a freshly reset slot never sees the keys left behind by the
previous occupant of that slot.

The per-step work is tensor-only (no Python loop over slots, no host syncs), so the same code
can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F

from agent.plugins.personaplex.streaming import StreamingModule

Activation = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------- norms / scales


class LayerNormF32(nn.LayerNorm):
    """LayerNorm computed in float32 whatever the activations' dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        y = F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps)
        return y.to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm; `compute_dtype` float32 gives the reference's `rms_norm_f32`."""

    def __init__(
        self, dim: int, eps: float = 1e-5, compute_dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.eps = eps
        self.compute_dtype = compute_dtype
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        var = self.eps + torch.mean(x**2, dim=-1, keepdim=True)
        return (x * (self.alpha.to(var) * torch.rsqrt(var))).to(in_dtype)


def make_norm(norm_type: str, dim: int) -> nn.Module:
    """Same names and epsilons as the reference `create_norm_fn`."""
    if norm_type == "layer_norm":
        return nn.LayerNorm(dim, eps=1e-5)
    if norm_type == "layer_norm_f32":
        return LayerNormF32(dim, eps=1e-8)
    if norm_type == "rms_norm":
        return RMSNorm(dim, eps=1e-5)
    if norm_type == "rms_norm_f32":
        return RMSNorm(dim, eps=1e-8, compute_dtype=torch.float32)
    raise ValueError(f"unknown norm type {norm_type!r}")


class LayerScale(nn.Module):
    def __init__(self, channels: int, init: float = 1e-4) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((channels,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


# --------------------------------------------------------------------------- feed-forward

_ACTIVATIONS: dict[str, Activation] = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "leaky_relu": F.leaky_relu,
    "elu": F.elu,
    "gelu": F.gelu,
    "silu": F.silu,
    "mish": F.mish,
    "softsign": F.softsign,
    "identity": lambda x: x,
}


def get_activation(activation: str | Activation) -> Activation:
    if callable(activation):
        return activation
    try:
        return _ACTIVATIONS[activation]
    except KeyError:
        raise ValueError(f"unknown activation {activation!r}") from None


class ActivationGating(nn.Module):
    """Gated FFN: `linear_out(act(a) * b)` where `[a, b] = linear_in(x)`."""

    def __init__(self, dim: int, dim_feedforward: int, activation: Activation) -> None:
        super().__init__()
        # The reference sizes the hidden layer so the gated FFN keeps ~the plain FFN's params.
        hidden = (21 * dim) // 8 if dim_feedforward == 4 * dim else (2 * dim_feedforward) // 3
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_in(x)
        h = h.view(*h.shape[:-1], 2, -1)
        return self.linear_out(self.activation(h[..., 0, :]) * h[..., 1, :])


def _num_weight_sets(weights_per_step: int, schedule: Sequence[int] | None) -> int:
    if not weights_per_step:
        return 1
    if schedule:
        if len(schedule) != weights_per_step:
            raise ValueError("weights_per_step_schedule must have weights_per_step entries")
        return max(schedule) + 1
    return weights_per_step


def _apply_per_step(
    modules: nn.ModuleList, schedule: Sequence[int] | None, x: torch.Tensor, step: int
) -> torch.Tensor:
    """Apply `modules[schedule[step + t]]` to time step t (one weight set per step)."""
    if len(modules) == 1:
        return modules[0](x)
    outs = []
    for t in range(x.shape[1]):
        index = step + t
        if schedule is not None:
            index = schedule[index]
        outs.append(modules[index](x[:, t : t + 1]))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


# --------------------------------------------------------------------------- rotary embedding


def rope_tables(
    positions: torch.Tensor, head_dim: int, max_period: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [B, 1, T, head_dim/2] (float32) for positions [B, T]."""
    half = torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(half * (-math.log(max_period) * 2 / head_dim))
    angles = freqs * positions.to(torch.float32)[:, None, :, None]
    return torch.cos(angles), torch.sin(angles)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool
) -> torch.Tensor:
    """Rotate x [B, H, T, D] (float32 math, result in x's dtype)."""
    d = x.shape[-1]
    if interleave:
        pairs = x.view(*x.shape[:-1], d // 2, 2)
        xr, xi = pairs[..., 0].float(), pairs[..., 1].float()
    else:
        xr, xi = x[..., : d // 2].float(), x[..., d // 2 :].float()
    out_r = (xr * cos - xi * sin).to(x.dtype)
    out_i = (xr * sin + xi * cos).to(x.dtype)
    if interleave:
        return torch.stack([out_r, out_i], dim=-1).view(x.shape)
    return torch.cat([out_r, out_i], dim=-1)


def sin_embedding(
    positions: torch.Tensor, dim: int, max_period: float, dtype: torch.dtype
) -> torch.Tensor:
    """Sinusoidal embedding [B, T, dim] for positions [B, T]."""
    half = dim // 2
    pos = positions.to(dtype)[..., None]
    adim = torch.arange(half, device=positions.device, dtype=dtype)
    phase = pos / (
        torch.full([], max_period, device=positions.device, dtype=dtype) ** (adim / (half - 1))
    )
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


# --------------------------------------------------------------------------- attention


@dataclass
class StepContext:
    """What every layer of one transformer call shares (computed once per call)."""

    rope: tuple[torch.Tensor, torch.Tensor] | None
    attn_mask: torch.Tensor | None  # bool [B or 1, 1, T, keys]
    write_index: torch.Tensor | None  # [B, T] ring slots to write (streaming only)
    active: torch.Tensor | None  # bool [B]; frozen slots keep their cache untouched
    weights_step: int


class StreamingMultiheadAttention(StreamingModule):
    """Self-attention with a per-slot ring KV cache (state: `keys`, `values` [B, Hkv, C, D])."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        causal: bool = False,
        context: int | None = None,
        rope_interleave: bool | None = None,
        kv_repeat: int = 1,
        weights_per_step: int = 0,
        weights_per_step_schedule: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        if num_heads % kv_repeat:
            raise ValueError("num_heads must be divisible by kv_repeat")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.kv_repeat = kv_repeat
        self.num_kv_heads = num_heads // kv_repeat
        self.causal = causal
        self.context = context
        self.rope_interleave = rope_interleave
        self.weights_per_step = weights_per_step
        self.weights_per_step_schedule = (
            list(weights_per_step_schedule) if weights_per_step_schedule else None
        )
        self.mult = _num_weight_sets(weights_per_step, self.weights_per_step_schedule)
        out_dim = embed_dim + 2 * self.num_kv_heads * self.head_dim
        self.in_projs = nn.ModuleList(
            nn.Linear(embed_dim, out_dim, bias=False) for _ in range(self.mult)
        )
        self.out_projs = nn.ModuleList(
            nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(self.mult)
        )
        self._register_load_state_dict_pre_hook(self._split_fused_weights, with_module=True)

    @staticmethod
    def _split_fused_weights(
        module: StreamingMultiheadAttention, state_dict: dict[str, Any], prefix: str, *_: Any
    ) -> None:
        """Released checkpoints store one fused `in_proj_weight` for all step weight sets."""
        renames = {
            "in_proj_weight": "in_projs.{i}.weight",
            "in_proj.weight": "in_projs.{i}.weight",
            "out_proj.weight": "out_projs.{i}.weight",
        }
        for source, target in renames.items():
            key = prefix + source
            if key not in state_dict:
                continue
            weight = state_dict.pop(key)
            parts = weight.view(module.mult, -1, *weight.shape[1:])
            for i in range(module.mult):
                state_dict[prefix + target.format(i=i)] = parts[i]

    @property
    def capacity(self) -> int:
        if self.context is not None:
            return self.context
        if self.weights_per_step:
            return self.weights_per_step
        raise RuntimeError(
            "streaming attention needs a context (or weights_per_step) to size its KV cache"
        )

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        weight = cast(nn.Linear, self.in_projs[0]).weight
        shape = (batch_size, self.num_kv_heads, self.capacity, self.head_dim)
        return {
            "keys": torch.zeros(shape, device=weight.device, dtype=weight.dtype),
            "values": torch.zeros(shape, device=weight.device, dtype=weight.dtype),
            # Ring entries written so far (capped at capacity): a slot always starts at
            # position 0, so entries [0, filled) are the only ones holding anything.
            "filled": torch.zeros(batch_size, device=weight.device, dtype=torch.long),
        }

    def reset_state_slots(self, mask: torch.Tensor) -> None:
        # Positions already hide stale entries; zeroing only keeps snapshots clean. Done in
        # place so a reset never allocates a whole fresh cache.
        assert self.state is not None
        slots = mask.to(self.state["keys"].device)
        self.state["keys"].masked_fill_(slots.view(-1, 1, 1, 1), 0)
        self.state["values"].masked_fill_(slots.view(-1, 1, 1, 1), 0)
        self.state["filled"].masked_fill_(slots, 0)

    def export_slot_state(self, slot: int) -> dict[str, torch.Tensor]:
        """Only the filled part of the ring: a prompt snapshot of a 7B model holds a few
        hundred frames, not the whole 3000-frame cache."""
        assert self.state is not None
        filled = int(self.state["filled"][slot])
        return {
            "keys": self.state["keys"][slot, :, :filled].clone(),
            "values": self.state["values"][slot, :, :filled].clone(),
            "filled": self.state["filled"][slot].clone(),
        }

    def import_slot_state(self, slot: int, snapshot: dict[str, torch.Tensor]) -> None:
        assert self.state is not None
        for key in ("keys", "values"):
            stored = snapshot[key]
            target = self.state[key][slot]
            target[:, : stored.shape[1]].copy_(stored)
            target[:, stored.shape[1] :].zero_()
        self.state["filled"][slot].copy_(snapshot["filled"])

    def _write_cache(
        self, k: torch.Tensor, v: torch.Tensor, ctx: StepContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.state is not None and ctx.write_index is not None
        keys, values = self.state["keys"], self.state["values"]
        b, h, t, d = k.shape
        index = ctx.write_index.view(b, 1, t, 1).expand(b, h, t, d)
        if ctx.active is not None:
            keep = ~ctx.active.view(b, 1, 1, 1)
            k = torch.where(keep, keys.gather(2, index), k)
            v = torch.where(keep, values.gather(2, index), v)
        keys.scatter_(2, index, k)
        values.scatter_(2, index, v)
        filled = self.state["filled"]
        written = t if ctx.active is None else ctx.active.to(filled.dtype) * t
        filled.add_(written).clamp_(max=keys.shape[2])
        return keys, values

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        b, t, _ = x.shape
        projected = _apply_per_step(
            self.in_projs, self.weights_per_step_schedule, x, ctx.weights_step
        )
        q = (
            projected[..., : self.embed_dim]
            .reshape(b, t, self.num_heads, self.head_dim)
            .transpose(1, 2)
        )
        kv = projected[..., self.embed_dim :].reshape(b, t, 2, self.num_kv_heads, self.head_dim)
        k = kv[:, :, 0].transpose(1, 2)
        v = kv[:, :, 1].transpose(1, 2)
        if ctx.rope is not None:
            cos, sin = ctx.rope
            q = apply_rope(q, cos, sin, bool(self.rope_interleave))
            k = apply_rope(k, cos, sin, bool(self.rope_interleave))
        if self.state is not None:
            k, v = self._write_cache(k, v, ctx)
        if self.kv_repeat > 1:
            k = k.repeat_interleave(self.kv_repeat, dim=1)
            v = v.repeat_interleave(self.kv_repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.attn_mask)
        out = out.transpose(1, 2).reshape(b, t, self.embed_dim)
        return _apply_per_step(
            self.out_projs, self.weights_per_step_schedule, out, ctx.weights_step
        )


# --------------------------------------------------------------------------- layer


class StreamingTransformerLayer(nn.Module):
    """Pre-norm layer: `x + ls1(attn(norm1(x)))`, then `x + ls2(ffn(norm2(x)))`."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dim_feedforward: int | list[int] = 2048,
        causal: bool = False,
        context: int | None = None,
        rope_interleave: bool | None = None,
        norm: str = "layer_norm",
        layer_scale: float | None = None,
        gating: str = "none",
        kv_repeat: int = 1,
        weights_per_step: int = 0,
        weights_per_step_schedule: Sequence[int] | None = None,
        activation: str | Activation = F.gelu,
    ) -> None:
        super().__init__()
        self.self_attn = StreamingMultiheadAttention(
            d_model,
            num_heads,
            causal=causal,
            context=context,
            rope_interleave=rope_interleave,
            kv_repeat=kv_repeat,
            weights_per_step=weights_per_step,
            weights_per_step_schedule=weights_per_step_schedule,
        )
        self.norm1 = make_norm(norm, d_model)
        self.norm2 = make_norm(norm, d_model)
        self.weights_per_step_schedule = (
            list(weights_per_step_schedule) if weights_per_step_schedule else None
        )
        num_weights = _num_weight_sets(weights_per_step, self.weights_per_step_schedule)
        self.gating: nn.Module | None = None
        self.linear1: nn.Linear | None = None
        self.linear2: nn.Linear | None = None
        if gating == "none":
            if weights_per_step or isinstance(dim_feedforward, list):
                raise ValueError("weights_per_step / per-step dim_feedforward need a gated FFN")
            self.linear1 = nn.Linear(d_model, dim_feedforward, bias=False)
            self.linear2 = nn.Linear(dim_feedforward, d_model, bias=False)
            self.activation = get_activation(activation)
        else:
            gate_activation = get_activation(gating)
            if weights_per_step:
                dims = (
                    dim_feedforward
                    if isinstance(dim_feedforward, list)
                    else [dim_feedforward] * num_weights
                )
                if len(dims) != num_weights:
                    raise ValueError("dim_feedforward list must have one entry per weight set")
                self.gating = nn.ModuleList(
                    ActivationGating(d_model, dim, gate_activation) for dim in dims
                )
            else:
                if isinstance(dim_feedforward, list):
                    raise ValueError("a dim_feedforward list needs weights_per_step")
                self.gating = ActivationGating(d_model, dim_feedforward, gate_activation)
        self.layer_scale_1: nn.Module = (
            nn.Identity() if layer_scale is None else LayerScale(d_model, layer_scale)
        )
        self.layer_scale_2: nn.Module = (
            nn.Identity() if layer_scale is None else LayerScale(d_model, layer_scale)
        )

    def _feed_forward(self, x: torch.Tensor, weights_step: int) -> torch.Tensor:
        if self.gating is None:
            assert self.linear1 is not None and self.linear2 is not None
            return self.linear2(self.activation(self.linear1(x)))
        if isinstance(self.gating, nn.ModuleList):
            return _apply_per_step(self.gating, self.weights_per_step_schedule, x, weights_step)
        return self.gating(x)

    def forward(self, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        update = self.self_attn(self.norm1(x), ctx)
        x = x.to(update) + self.layer_scale_1(update)
        update = self._feed_forward(self.norm2(x), ctx.weights_step)
        return x.to(update) + self.layer_scale_2(update)


# --------------------------------------------------------------------------- transformer


class StreamingTransformer(StreamingModule):
    """Stack of layers; streaming state `offset` [B] holds each slot's next position.

    Keyword names follow the reference `StreamingTransformer`; options it has that no
    released Moshi/Mimi/PersonaPlex model uses (cross-attention, quantization, LoRA) are
    refused with a clear error rather than silently ignored.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        num_layers: int,
        dim_feedforward: int | list[int] = 2048,
        causal: bool = False,
        context: int | None = None,
        positional_embedding: str = "sin",
        max_period: float = 10_000,
        positional_scale: float = 1.0,
        norm: str = "layer_norm",
        layer_scale: float | None = None,
        gating: str = "none",
        kv_repeat: int = 1,
        weights_per_step: int = 0,
        weights_per_step_schedule: Sequence[int] | None = None,
        activation: str | Activation = F.gelu,
        cross_attention: bool = False,
        skip_self_attn: bool = False,
        quantize: bool = False,
        betas: Any = None,
        checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if cross_attention or skip_self_attn or quantize:
            raise ValueError("cross_attention, skip_self_attn and quantize are not supported")
        if positional_embedding not in {"sin", "rope", "sin_rope", "none", "rope_concat"}:
            raise ValueError(f"unknown positional_embedding {positional_embedding!r}")
        if d_model % num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.causal = causal
        self.context = context
        self.positional_embedding = positional_embedding
        self.max_period = max_period
        self.positional_scale = positional_scale
        self.use_rope = positional_embedding in {"rope", "sin_rope", "rope_concat"}
        self.use_sin = positional_embedding in {"sin", "sin_rope"}
        rope_interleave = positional_embedding != "rope_concat" if self.use_rope else None
        self.layers = nn.ModuleList(
            StreamingTransformerLayer(
                d_model,
                num_heads,
                dim_feedforward=dim_feedforward,
                causal=causal,
                context=context,
                rope_interleave=rope_interleave,
                norm=norm,
                layer_scale=layer_scale,
                gating=gating,
                kv_repeat=kv_repeat,
                weights_per_step=weights_per_step,
                weights_per_step_schedule=weights_per_step_schedule,
                activation=activation,
            )
            for _ in range(num_layers)
        )
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        device = next(self.parameters()).device
        return {"offset": torch.zeros(batch_size, device=device, dtype=torch.long)}

    def _context(
        self,
        batch: int,
        steps: int,
        device: torch.device,
        active: torch.Tensor | None,
        weights_step: int,
    ) -> StepContext:
        arange = torch.arange(steps, device=device)
        if self.state is None:
            positions = arange[None]
            key_positions = positions
            write_index = None
            valid = None
        else:
            positions = self.state["offset"][:, None] + arange
            capacity = cast(StreamingTransformerLayer, self.layers[0]).self_attn.capacity
            if steps > capacity:
                raise ValueError(
                    f"cannot stream {steps} steps at once into a KV cache of {capacity}"
                )
            write_index = positions % capacity
            # Ring slot i holds the newest position p <= last with p = i (mod capacity).
            last = positions[:, -1:]
            ring = torch.arange(capacity, device=device)
            key_positions = last - (last - ring) % capacity
            valid = key_positions >= 0
        mask = None
        if self.causal:
            delta = positions[:, :, None] - key_positions[:, None, :]
            mask = delta >= 0
            if self.context is not None:
                mask = mask & (delta < self.context)
            if valid is not None:
                mask = mask & valid[:, None, :]
            if active is not None:
                # Frozen slots compute garbage that is thrown away; an all-false row would be NaN.
                mask = mask | ~active[:, None, None]
            mask = mask[:, None]
        elif valid is not None:
            mask = valid[:, None, None, :].expand(-1, 1, steps, -1)
            if active is not None:
                mask = mask | ~active[:, None, None, None]
        rope = None
        if self.use_rope:
            rope = rope_tables(positions.expand(batch, -1), self.head_dim, self.max_period)
        return StepContext(
            rope=rope,
            attn_mask=mask,
            write_index=write_index,
            active=active,
            weights_step=weights_step,
        )

    def forward(
        self, x: torch.Tensor, active: torch.Tensor | None = None, weights_step: int = 0
    ) -> torch.Tensor:
        """x [B, T, C] -> [B, T, C]. `active` (bool [B]) freezes the other slots' state;
        `weights_step` is the step index of x[:, 0] for models with `weights_per_step`."""
        batch, steps, channels = x.shape
        in_dtype = x.dtype
        ctx = self._context(batch, steps, x.device, active, weights_step)
        if self.use_sin:
            positions = torch.arange(steps, device=x.device)[None]
            if self.state is not None:
                positions = positions + self.state["offset"][:, None]
            x = x + self.positional_scale * sin_embedding(
                positions, channels, self.max_period, x.dtype
            )
        for layer in self.layers:
            x = layer(x, ctx)
        if self.state is not None:
            offset = self.state["offset"]
            if active is None:
                offset.add_(steps)
            else:
                offset.add_(active.to(offset.dtype) * steps)
        return x.to(in_dtype)


class ProjectedTransformer(nn.Module):
    """Transformer with optional input/output projections (reference `ProjectedTransformer`)."""

    def __init__(
        self,
        input_dimension: int,
        output_dimensions: Sequence[int],
        d_model: int,
        *,
        conv_layout: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        self.transformer = StreamingTransformer(d_model=d_model, **kwargs)
        self.input_dimension = input_dimension
        self.output_dimensions = tuple(output_dimensions)
        self.conv_layout = conv_layout
        self.input_proj = (
            nn.Linear(input_dimension, d_model, bias=False) if d_model != input_dimension else None
        )
        self.output_projs = nn.ModuleList(
            nn.Identity() if dim == d_model else nn.Linear(d_model, dim, bias=False)
            for dim in self.output_dimensions
        )
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, active: torch.Tensor | None = None) -> list[torch.Tensor]:
        if self.conv_layout:
            x = x.transpose(1, 2)
        if self.input_proj is not None:
            x = self.input_proj(x)
        z = self.transformer(x, active=active)
        outputs = []
        for proj in self.output_projs:
            y = proj(z)
            outputs.append(y.transpose(1, 2) if self.conv_layout else y)
        return outputs


def split_fused_attention(state: dict[str, torch.Tensor], expected: dict[str, torch.Size]) -> None:
    """Split fused `in_proj_weight` / `out_proj.weight` (as both references' loaders read
    released checkpoints) into our per-step keys, whatever the number of steps stored (the
    attention module's own load hook assumes all of them). In place; for the LM and Mimi."""
    fused_names = {
        "in_proj_weight": "in_projs",
        "in_proj.weight": "in_projs",
        "out_proj.weight": "out_projs",
    }
    for key in list(state):
        for fused, split in fused_names.items():
            if not key.endswith("." + fused):
                continue
            stem = key[: -len(fused)]
            first = f"{stem}{split}.0.weight"
            if first not in expected:
                break
            rows = expected[first][0]
            weight = state.pop(key)
            for index, part in enumerate(weight.split(rows, dim=0)):
                state[f"{stem}{split}.{index}.weight"] = part
            break
