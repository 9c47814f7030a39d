"""Causal 1-D convolutions that stream: each call consumes a whole number of strides.

The key layout follows the reference checkpoints: a `StreamingConv1d` holds its torch conv at
`conv.conv` (so weights are `...conv.conv.weight`), a `StreamingConvTranspose1d` at
`convtr.convtr`. Released Mimi weights are stored with weight norm already folded in, so the
layers here are plain convolutions; `fold_weight_norm` folds `weight_g`/`weight_v` pairs for
checkpoints that kept the parametrisation.

Streaming state (slot is dim 0):
- conv: `previous`, the last `kernel_eff - stride` input samples (the causal left context),
  and for replicate padding `first`, whether the slot has seen no input yet;
- transposed conv: `partial`, the overlap-add tail that the next call's output must include.
A call outside streaming computes as if from fresh state, so offline == streaming.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .streaming import StreamingModule

PAD_MODES = ("constant", "replicate")


class ConvHolder(nn.Module):
    """Holds the torch conv one level down, only to reproduce the reference key names."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        self.conv = conv


class ConvTrHolder(nn.Module):
    def __init__(self, convtr: nn.ConvTranspose1d) -> None:
        super().__init__()
        self.convtr = convtr


class StreamingConv1d(StreamingModule):
    """Causal Conv1d, left-padded with its own history (zeros, or the first sample)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        pad_mode: str = "constant",
    ) -> None:
        super().__init__()
        if pad_mode not in PAD_MODES:
            raise ValueError(f"unsupported pad_mode {pad_mode!r}; expected one of {PAD_MODES}")
        self.pad_mode = pad_mode
        self.conv = ConvHolder(
            nn.Conv1d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                dilation=dilation,
                groups=groups,
                bias=bias,
            )
        )
        self.in_channels = in_channels
        self.stride = stride
        effective_kernel = (kernel_size - 1) * dilation + 1
        # Samples of left context kept between calls; may be negative-free only if stride <= kernel.
        self.history = max(effective_kernel - stride, 0)

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        weight = self.conv.conv.weight
        state = {
            "previous": torch.zeros(
                batch_size, self.in_channels, self.history, dtype=weight.dtype, device=weight.device
            )
        }
        if self.pad_mode == "replicate":
            state["first"] = torch.ones(batch_size, dtype=torch.bool, device=weight.device)
        return state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        if length == 0 or length % self.stride != 0:
            raise ValueError(
                f"conv input length {length} must be a positive multiple of the stride {self.stride}"
            )
        conv = self.conv.conv
        if self.history == 0:
            return F.conv1d(x, conv.weight, conv.bias, self.stride, 0, conv.dilation, conv.groups)
        state = self.state if self.state is not None else self.init_state(x.shape[0])
        previous = state["previous"]
        if self.pad_mode == "replicate":
            # A fresh slot pads with copies of its first sample instead of zeros.
            first = state["first"].view(-1, 1, 1)
            previous = torch.where(first, x[..., :1], previous)
            state["first"].zero_()
        padded = torch.cat([previous, x], dim=-1)
        # F.conv1d directly: the per-frame cost of these small convs is mostly call overhead.
        y = F.conv1d(padded, conv.weight, conv.bias, self.stride, 0, conv.dilation, conv.groups)
        state["previous"].copy_(padded[..., -self.history :])
        return y


class StreamingConvTranspose1d(StreamingModule):
    """Causal ConvTranspose1d: the right overhang is carried to the next call."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.convtr = ConvTrHolder(
            nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias)
        )
        self.out_channels = out_channels
        self.overhang = max(kernel_size - stride, 0)

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        weight = self.convtr.convtr.weight
        return {
            "partial": torch.zeros(
                batch_size, self.out_channels, self.overhang, dtype=weight.dtype, device=weight.device
            )
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        convtr = self.convtr.convtr
        y = F.conv_transpose1d(x, convtr.weight, convtr.bias, convtr.stride, 0, 0, convtr.groups)
        if self.overhang == 0:
            return y
        tail = self.overhang
        if self.state is None:
            # Offline: fresh (zero) overlap, and the overhang is dropped.
            return y[..., :-tail]
        partial = self.state["partial"]
        y[..., :tail] += partial
        # The overhang holds only partial sums; the bias is added once, when it is emitted.
        overhang = y[..., -tail:]
        if convtr.bias is not None:
            partial.copy_(overhang - convtr.bias[:, None])
        else:
            partial.copy_(overhang)
        return y[..., :-tail]


def fold_weight_norm(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace `X.weight_g` + `X.weight_v` pairs by `X.weight = g * v / ||v||` (norm over dims>0).

    Also accepts the newer `X.parametrizations.weight.original0/1` spelling.
    """
    out = dict(state_dict)
    pairs: list[tuple[str, str, str]] = []
    for key in state_dict:
        if key.endswith(".weight_g"):
            base = key[: -len(".weight_g")]
            pairs.append((base, key, base + ".weight_v"))
        elif key.endswith(".parametrizations.weight.original0"):
            base = key[: -len(".parametrizations.weight.original0")]
            pairs.append((base, key, base + ".parametrizations.weight.original1"))
    for base, g_key, v_key in pairs:
        if v_key not in state_dict:
            raise KeyError(f"weight-norm key {g_key} has no matching {v_key}")
        g = state_dict[g_key].float()
        v = state_dict[v_key].float()
        dims = tuple(range(1, v.dim()))
        norm = v.pow(2).sum(dim=dims, keepdim=True).sqrt()
        out[base + ".weight"] = (g * v / norm).to(state_dict[v_key].dtype)
        del out[g_key], out[v_key]
    return out


def extra_padding_for_conv1d(length: int, kernel_size: int, stride: int, padding_total: int = 0) -> int:
    """Right padding so the last window of a strided conv is complete (offline encode)."""
    n_frames = (length - kernel_size + padding_total) / stride + 1
    ideal_length = (math.ceil(n_frames) - 1) * stride + (kernel_size - padding_total)
    return ideal_length - length


def pad_to_whole_frames(x: torch.Tensor, frame_size: int) -> torch.Tensor:
    extra = extra_padding_for_conv1d(x.shape[-1], frame_size, frame_size)
    return F.pad(x, (0, extra)) if extra > 0 else x
