"""Mimi, the streaming neural audio codec: waveform <-> discrete codes at 12.5 Hz.

encode: SEANet encoder -> encoder transformer -> strided conv down to the frame rate ->
        split RVQ -> codes [B, K, n]
decode: codes -> RVQ centroids -> transposed conv up to the encoder rate ->
        decoder transformer -> SEANet decoder -> waveform [B, 1, 1920 * n]

Streaming is per batch slot through `streaming.py`: `start_streaming(mimi, B)` allocates every
layer's state, `reset_slots(mimi, mask)` restarts some slots (a new call) without touching the
others. While streaming, inputs must be a whole number of frames; the stepper feeds exactly
one frame per slot per tick. Outside streaming, `encode` pads the input to whole frames.

`encode`/`decode` take an optional `active` mask (bool [B]): slots where it is False are
computed but keep their streaming state (frozen), like the LM stepper's frozen slots.

Module names follow the reference checkpoint (`encoder.model.N...`, `encoder_transformer...`,
`downsample.conv.conv.conv.weight`, `upsample.convtr.convtr.convtr.weight`, `quantizer...`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor, nn

from agent.plugins.personaplex.conv import (
    StreamingConv1d,
    StreamingConvTranspose1d,
    pad_to_whole_frames,
)
from agent.plugins.personaplex.quantizer import SplitResidualVectorQuantizer
from agent.plugins.personaplex.seanet import SEANetDecoder, SEANetEncoder


class ConvDownsample1d(nn.Module):
    """Learnt strided conv from the encoder rate to the frame rate (replicate-padded)."""

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.conv = StreamingConv1d(
            dimension,
            dimension,
            kernel_size=2 * stride,
            stride=stride,
            bias=False,
            pad_mode="replicate",
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class ConvTrUpsample1d(nn.Module):
    """Learnt transposed conv back to the encoder rate.

    Depthwise (groups = dimension): the released Mimi was trained that way (the reference calls
    it `upsample_channel_wise_bug`), so the checkpoint's weight is [dimension, 1, 2 * stride].
    """

    def __init__(self, stride: int, dimension: int) -> None:
        super().__init__()
        self.convtr = StreamingConvTranspose1d(
            dimension,
            dimension,
            kernel_size=2 * stride,
            stride=stride,
            groups=dimension,
            bias=False,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.convtr(x)


class MimiModel(nn.Module):
    def __init__(
        self,
        encoder: SEANetEncoder,
        decoder: SEANetDecoder,
        quantizer: SplitResidualVectorQuantizer,
        encoder_transformer: nn.Module | None,
        decoder_transformer: nn.Module | None,
        sample_rate: int,
        frame_rate: float,
        channels: int = 1,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.encoder_transformer = encoder_transformer
        self.decoder_transformer = decoder_transformer
        self.quantizer = quantizer
        self.sample_rate = sample_rate
        self.frame_rate = frame_rate
        self.channels = channels
        self.dimension = encoder.dimension
        frame_size = sample_rate / frame_rate
        if frame_size != int(frame_size):
            raise ValueError(f"sample_rate / frame_rate must be a whole number, got {frame_size}")
        self.frame_size = int(frame_size)
        if self.frame_size % encoder.hop_length != 0:
            raise ValueError(
                f"frame size {self.frame_size} is not a multiple of the SEANet hop "
                f"{encoder.hop_length}"
            )
        self.resample_stride = self.frame_size // encoder.hop_length
        self._conv_layers: list[StreamingConv1d | StreamingConvTranspose1d] | None = None
        self.downsample: ConvDownsample1d | None = None
        self.upsample: ConvTrUpsample1d | None = None
        if self.resample_stride > 1:
            self.downsample = ConvDownsample1d(self.resample_stride, self.dimension)
            self.upsample = ConvTrUpsample1d(self.resample_stride, self.dimension)

    @property
    def num_codebooks(self) -> int:
        return self.quantizer.num_codebooks

    @property
    def total_codebooks(self) -> int:
        return self.quantizer.total_codebooks

    @property
    def cardinality(self) -> int:
        return self.quantizer.cardinality

    def set_num_codebooks(self, n: int) -> None:
        self.quantizer.set_num_codebooks(n)

    @property
    def is_streaming(self) -> bool:
        return cast(StreamingConv1d, self.encoder.model[0]).is_streaming

    def _check_frames(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[1] != self.channels:
            raise ValueError(f"audio must be [B, {self.channels}, T], got {list(x.shape)}")
        length = x.shape[-1]
        if not self.is_streaming:
            return pad_to_whole_frames(x, self.frame_size)
        if length == 0 or length % self.frame_size != 0:
            raise ValueError(
                f"streaming input length {length} must be a positive multiple of the frame size "
                f"{self.frame_size}; buffer audio into whole frames before encoding"
            )
        return x

    def _convs(self) -> list[StreamingConv1d | StreamingConvTranspose1d]:
        if self._conv_layers is None:
            self._conv_layers = [
                module
                for module in self.modules()
                if isinstance(module, (StreamingConv1d, StreamingConvTranspose1d))
            ]
        return self._conv_layers

    @contextmanager
    def _frozen_slots(self, active: Tensor | None, batch: int) -> Iterator[None]:
        if active is None:
            yield
            return
        if not self.is_streaming:
            raise ValueError("an active-slot mask only applies while streaming")
        if active.shape != (batch,) or active.dtype != torch.bool:
            raise ValueError(
                f"active must be a bool tensor of shape [{batch}], got {active.dtype} "
                f"{list(active.shape)}"
            )
        convs = self._convs()
        for conv in convs:
            conv.active = active
        try:
            yield
        finally:
            for conv in convs:
                conv.active = None

    def _transform(
        self, transformer: nn.Module | None, emb: Tensor, active: Tensor | None
    ) -> Tensor:
        if transformer is None:
            return emb
        if active is None:
            return transformer(emb)[0]
        return transformer(emb, active=active)[0]

    def encode_latent(self, x: Tensor, active: Tensor | None = None) -> Tensor:
        """Audio [B, C, T] -> unquantized latent [B, dimension, frames]."""
        x = self._check_frames(x)
        with self._frozen_slots(active, x.shape[0]):
            emb = self.encoder(x)
            emb = self._transform(self.encoder_transformer, emb, active)
            if self.downsample is not None:
                emb = self.downsample(emb)
        return emb

    def encode(self, x: Tensor, active: Tensor | None = None) -> Tensor:
        """Audio [B, C, frame_size * n] -> codes [B, num_codebooks, n] (int64)."""
        return self.quantizer.encode(self.encode_latent(x, active))

    def decode(self, codes: Tensor, active: Tensor | None = None) -> Tensor:
        """Codes [B, K, n] (K <= total codebooks, values in [0, cardinality)) -> audio
        [B, C, frame_size * n]."""
        if codes.dim() != 3:
            raise ValueError(f"codes must be [B, K, n], got {list(codes.shape)}")
        dtype = cast(StreamingConv1d, self.decoder.model[0]).conv.conv.weight.dtype
        emb = self.quantizer.decode(codes, dtype)
        with self._frozen_slots(active, codes.shape[0]):
            if self.upsample is not None:
                emb = self.upsample(emb)
            emb = self._transform(self.decoder_transformer, emb, active)
            return self.decoder(emb)

