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

Frozen slots: while `active` (bool [B], set by the owner of the layer for one call, see
`MimiModel`) is not None, slots where it is False compute normally but keep their state, so
the call leaves them exactly as if it had not happened for them.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from agent.plugins.personaplex.streaming import StreamingModule

PAD_MODES = ("constant", "replicate")
# On CPU, oneDNN picks slow kernels for convs with only a few output steps (Mimi's 512->1024
# stride-8 conv on one frame: 7 ms single-threaded, 1.6 ms as one GEMM that reads the weight
# once; its 1024->512 transposed conv: 32 ms vs 1.8 ms). Measured on the released shapes: the
# GEMM wins up to 16 output rows (batch x steps) for every conv, and at any batch for the two
# convs with 8 M-entry weights (2x at 64 rows). Elsewhere torch's conv is kept; on GPUs too.
GEMM_MAX_ROWS = 16
GEMM_BIG_WEIGHT = 1 << 22


def _gemm_wins(rows: int, weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu":
        return False
    return rows <= GEMM_MAX_ROWS or weight.numel() >= GEMM_BIG_WEIGHT


def conv1d_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int
) -> torch.Tensor:
    """F.conv1d (no padding, dilation 1, groups 1) as unfold + one matrix multiply."""
    batch, in_channels, _ = x.shape
    out_channels, _, kernel = weight.shape
    columns = x.unfold(-1, kernel, stride)  # [B, Cin, steps, K]
    steps = columns.shape[2]
    columns = columns.permute(0, 2, 1, 3).reshape(batch * steps, in_channels * kernel)
    matrix = weight.view(out_channels, in_channels * kernel).t()
    y = torch.addmm(bias, columns, matrix) if bias is not None else columns.mm(matrix)
    return y.view(batch, steps, out_channels).transpose(1, 2)


def conv_transpose1d_gemm(x: torch.Tensor, weight: torch.Tensor, stride: int) -> torch.Tensor:
    """F.conv_transpose1d without bias (groups 1, kernel a multiple of stride) as one matrix
    multiply plus an overlap-add of kernel/stride shifted blocks."""
    batch, in_channels, steps = x.shape
    _, out_channels, kernel = weight.shape
    blocks = kernel // stride
    z = (
        x.transpose(1, 2)
        .reshape(batch * steps, in_channels)
        .mm(weight.view(in_channels, out_channels * kernel))
    )
    z = z.view(batch, steps, out_channels, blocks, stride).permute(
        0, 2, 3, 1, 4
    )  # [B, Cout, blocks, steps, S]
    y = x.new_zeros(batch, out_channels, steps + blocks - 1, stride)
    for block in range(blocks):
        y[:, :, block : block + steps] += z[:, :, block]
    return y.view(batch, out_channels, (steps + blocks - 1) * stride)


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
        self.active: torch.Tensor | None = None
        self.gemm_capable = dilation == 1 and groups == 1
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

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.conv.conv
        steps = (x.shape[-1] - self.history - self.stride) // self.stride + 1
        if self.gemm_capable and _gemm_wins(x.shape[0] * steps, conv.weight):
            return conv1d_gemm(x, conv.weight, conv.bias, self.stride)
        # F.conv1d directly: the per-frame cost of small convs is mostly call overhead.
        return F.conv1d(x, conv.weight, conv.bias, self.stride, 0, conv.dilation, conv.groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        if length == 0 or length % self.stride != 0:
            raise ValueError(
                f"conv input length {length} must be a positive multiple of the stride "
                f"{self.stride}"
            )
        if self.history == 0:
            return self._conv(x)
        state = self.state if self.state is not None else self.init_state(x.shape[0])
        kept = state["previous"]
        previous = kept
        if self.pad_mode == "replicate":
            # A fresh slot pads with copies of its first sample instead of zeros.
            first = state["first"]
            previous = torch.where(first.view(-1, 1, 1), x[..., :1], previous)
            if self.active is None:
                first.zero_()
            else:
                first.logical_and_(~self.active)
        padded = torch.cat([previous, x], dim=-1)
        y = self._conv(padded)
        history = padded[..., -self.history :]
        if self.active is not None:
            history = torch.where(self.active.view(-1, 1, 1), history, kept)
        kept.copy_(history)
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
            nn.ConvTranspose1d(
                in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias
            )
        )
        self.out_channels = out_channels
        self.stride = stride
        self.active: torch.Tensor | None = None
        self.overhang = max(kernel_size - stride, 0)
        self.gemm_capable = groups == 1 and kernel_size % stride == 0

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        weight = self.convtr.convtr.weight
        return {
            "partial": torch.zeros(
                batch_size,
                self.out_channels,
                self.overhang,
                dtype=weight.dtype,
                device=weight.device,
            )
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        convtr = self.convtr.convtr
        # Computed without bias: the overhang carried to the next call must hold bias-free
        # partial sums; the bias is added once, to the samples emitted now.
        if self.gemm_capable and _gemm_wins(x.shape[0] * x.shape[-1], convtr.weight):
            y = conv_transpose1d_gemm(x, convtr.weight, self.stride)
        else:
            y = F.conv_transpose1d(x, convtr.weight, None, self.stride, 0, 0, convtr.groups)
        tail = self.overhang
        if tail and self.state is not None:
            partial = self.state["partial"]
            y[..., :tail] += partial
            overhang = y[..., -tail:]
            if self.active is not None:
                overhang = torch.where(self.active.view(-1, 1, 1), overhang, partial)
            partial.copy_(overhang)
        if convtr.bias is not None:
            y += convtr.bias[:, None]
        # Offline, the overhang is dropped (as if the stream ended here).
        return y[..., : y.shape[-1] - tail]


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


def extra_padding_for_conv1d(
    length: int, kernel_size: int, stride: int, padding_total: int = 0
) -> int:
    """Right padding so the last window of a strided conv is complete (offline encode)."""
    n_frames = (length - kernel_size + padding_total) / stride + 1
    ideal_length = (math.ceil(n_frames) - 1) * stride + (kernel_size - padding_total)
    return ideal_length - length


def pad_to_whole_frames(x: torch.Tensor, frame_size: int) -> torch.Tensor:
    extra = extra_padding_for_conv1d(x.shape[-1], frame_size, frame_size)
    return F.pad(x, (0, extra)) if extra > 0 else x
