"""SEANet encoder and decoder built from streaming causal convolutions.

Module trees (and so state-dict keys) follow the reference: `model.N` is an `nn.Sequential`
of activations, convs and residual blocks; a residual block keeps its convs in `block.N` and,
without a true skip, a 1x1 conv in `shortcut`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from agent.plugins.personaplex.conv import StreamingConv1d, StreamingConvTranspose1d

NORMS = ("none", "weight_norm")


def make_activation(name: str, params: dict[str, Any] | None) -> nn.Module:
    activation = getattr(nn, name, None)
    if not (isinstance(activation, type) and issubclass(activation, nn.Module)):
        raise ValueError(
            f"unknown activation {name!r}: expected a torch.nn module name such as 'ELU'"
        )
    return activation(**(params or {}))


def check_norm(norm: str) -> None:
    # Weight norm only changes how weights are trained; loading folds it (conv.fold_weight_norm).
    if norm not in NORMS:
        raise ValueError(f"unsupported conv norm {norm!r}; expected one of {NORMS}")


def check_causal(causal: bool) -> None:
    if not causal:
        raise ValueError("only causal SEANet models can stream; the config has causal=false")


class SEANetResnetBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        kernel_sizes: Sequence[int] = (3, 1),
        dilations: Sequence[int] = (1, 1),
        activation: str = "ELU",
        activation_params: dict[str, Any] | None = None,
        pad_mode: str = "constant",
        compress: int = 2,
        true_skip: bool = True,
    ) -> None:
        super().__init__()
        if len(kernel_sizes) != len(dilations):
            raise ValueError("kernel_sizes and dilations must have the same length")
        hidden = dim // compress
        layers: list[nn.Module] = []
        last = len(kernel_sizes) - 1
        for i, (kernel_size, dilation) in enumerate(zip(kernel_sizes, dilations, strict=True)):
            layers.append(make_activation(activation, activation_params))
            layers.append(
                StreamingConv1d(
                    dim if i == 0 else hidden,
                    dim if i == last else hidden,
                    kernel_size,
                    dilation=dilation,
                    pad_mode=pad_mode,
                )
            )
        self.block = nn.Sequential(*layers)
        self.shortcut: nn.Module = (
            nn.Identity() if true_skip else StreamingConv1d(dim, dim, 1, pad_mode=pad_mode)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.shortcut(x) + self.block(x)


class SEANetEncoder(nn.Module):
    """Waveform [B, channels, T] -> latent [B, dimension, T / hop_length]."""

    def __init__(
        self,
        channels: int = 1,
        dimension: int = 128,
        n_filters: int = 32,
        n_residual_layers: int = 3,
        ratios: Sequence[int] = (8, 5, 4, 2),
        activation: str = "ELU",
        activation_params: dict[str, Any] | None = None,
        norm: str = "none",
        norm_params: dict[str, Any] | None = None,
        kernel_size: int = 7,
        last_kernel_size: int = 7,
        residual_kernel_size: int = 3,
        dilation_base: int = 2,
        causal: bool = True,
        pad_mode: str = "constant",
        true_skip: bool = True,
        compress: int = 2,
        disable_norm_outer_blocks: int = 0,
        **decoder_only: Any,
    ) -> None:
        super().__init__()
        check_norm(norm)
        check_causal(causal)
        _reject_unknown(
            decoder_only, {"final_activation", "final_activation_params", "trim_right_ratio"}
        )
        activation_params = {"alpha": 1.0} if activation_params is None else activation_params
        self.channels = channels
        self.dimension = dimension
        # The config lists decoder (upsampling) ratios; the encoder walks them in reverse.
        self.ratios = list(reversed(ratios))
        self.hop_length = _product(self.ratios)
        mult = 1
        layers: list[nn.Module] = [
            StreamingConv1d(channels, mult * n_filters, kernel_size, pad_mode=pad_mode)
        ]
        for ratio in self.ratios:
            for j in range(n_residual_layers):
                layers.append(
                    SEANetResnetBlock(
                        mult * n_filters,
                        kernel_sizes=(residual_kernel_size, 1),
                        dilations=(dilation_base**j, 1),
                        activation=activation,
                        activation_params=activation_params,
                        pad_mode=pad_mode,
                        compress=compress,
                        true_skip=true_skip,
                    )
                )
            layers.append(make_activation(activation, activation_params))
            layers.append(
                StreamingConv1d(
                    mult * n_filters,
                    mult * n_filters * 2,
                    kernel_size=ratio * 2,
                    stride=ratio,
                    pad_mode=pad_mode,
                )
            )
            mult *= 2
        layers.append(make_activation(activation, activation_params))
        layers.append(
            StreamingConv1d(mult * n_filters, dimension, last_kernel_size, pad_mode=pad_mode)
        )
        self.model = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)


class SEANetDecoder(nn.Module):
    """Latent [B, dimension, T] -> waveform [B, channels, T * hop_length]."""

    def __init__(
        self,
        channels: int = 1,
        dimension: int = 128,
        n_filters: int = 32,
        n_residual_layers: int = 3,
        ratios: Sequence[int] = (8, 5, 4, 2),
        activation: str = "ELU",
        activation_params: dict[str, Any] | None = None,
        final_activation: str | None = None,
        final_activation_params: dict[str, Any] | None = None,
        norm: str = "none",
        norm_params: dict[str, Any] | None = None,
        kernel_size: int = 7,
        last_kernel_size: int = 7,
        residual_kernel_size: int = 3,
        dilation_base: int = 2,
        causal: bool = True,
        pad_mode: str = "constant",
        true_skip: bool = True,
        compress: int = 2,
        disable_norm_outer_blocks: int = 0,
        trim_right_ratio: float = 1.0,
    ) -> None:
        super().__init__()
        check_norm(norm)
        check_causal(causal)
        if trim_right_ratio != 1.0:
            raise ValueError("only trim_right_ratio=1.0 (all trimming on the right) can stream")
        activation_params = {"alpha": 1.0} if activation_params is None else activation_params
        self.channels = channels
        self.dimension = dimension
        self.ratios = list(ratios)
        self.hop_length = _product(self.ratios)
        mult = 2 ** len(self.ratios)
        layers: list[nn.Module] = [
            StreamingConv1d(dimension, mult * n_filters, kernel_size, pad_mode=pad_mode)
        ]
        for ratio in self.ratios:
            layers.append(make_activation(activation, activation_params))
            layers.append(
                StreamingConvTranspose1d(
                    mult * n_filters, mult * n_filters // 2, kernel_size=ratio * 2, stride=ratio
                )
            )
            for j in range(n_residual_layers):
                layers.append(
                    SEANetResnetBlock(
                        mult * n_filters // 2,
                        kernel_sizes=(residual_kernel_size, 1),
                        dilations=(dilation_base**j, 1),
                        activation=activation,
                        activation_params=activation_params,
                        pad_mode=pad_mode,
                        compress=compress,
                        true_skip=true_skip,
                    )
                )
            mult //= 2
        layers.append(make_activation(activation, activation_params))
        layers.append(StreamingConv1d(n_filters, channels, last_kernel_size, pad_mode=pad_mode))
        if final_activation is not None:
            layers.append(make_activation(final_activation, final_activation_params))
        self.model = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        return self.model(z)


def _product(values: Sequence[int]) -> int:
    out = 1
    for value in values:
        out *= int(value)
    return out


def _reject_unknown(extra: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(extra) - allowed)
    if unknown:
        raise TypeError(f"unexpected SEANet config keys: {unknown}")
