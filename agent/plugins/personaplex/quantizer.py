"""Split residual vector quantizer (inference only): a semantic RVQ plus an acoustic RVQ.

Both halves see the same projected latent (the acoustic half does not quantize the semantic
residual). Codes are [B, K, T] with the semantic codebooks first.

State-dict layout as the reference stores it, e.g. for the semantic half:
    rvq_first.input_proj.weight               [dimension, input_dimension, 1]
    rvq_first.output_proj.weight              [output_dimension, dimension, 1]
    rvq_first.vq.layers.N._codebook._initialized   [1]
    rvq_first.vq.layers.N._codebook.cluster_usage  [bins]
    rvq_first.vq.layers.N._codebook.embedding_sum  [bins, dimension]
A centroid is `embedding_sum / max(cluster_usage, epsilon)`. Centroids are kept in float32
and nearest-centroid search runs in float32 whatever the model dtype, so codes do not depend
on the compute dtype's rounding.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

EPSILON = 1e-5
LEGACY_BUFFER_NAMES = {
    "inited": "_initialized",
    "cluster_size": "cluster_usage",
    "embed_avg": "embedding_sum",
    "embed_sum": "embedding_sum",
}


class EuclideanCodebook(nn.Module):
    # Buffers (register_buffer below), declared for the type checker.
    _initialized: Tensor
    cluster_usage: Tensor
    embedding_sum: Tensor

    def __init__(self, dim: int, codebook_size: int, epsilon: float = EPSILON) -> None:
        super().__init__()
        self.dim = dim
        self.codebook_size = codebook_size
        self.epsilon = epsilon
        self.register_buffer("_initialized", torch.tensor([False], dtype=torch.float))
        self.register_buffer("cluster_usage", torch.ones(codebook_size))
        # Random centroids (the released weights replace them): a freshly built model then
        # gives varied codes, which tiny random-weight checkpoints rely on.
        self.register_buffer("embedding_sum", torch.randn(codebook_size, dim))

    def centroids(self) -> Tensor:
        usage = self.cluster_usage.float().clamp(min=self.epsilon)
        return self.embedding_sum.float() / usage[:, None]


class VectorQuantization(nn.Module):
    """One codebook level; exists so keys read `layers.N._codebook.*`."""

    def __init__(self, dim: int, codebook_size: int, epsilon: float = EPSILON) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size, epsilon)


class ResidualVectorQuantization(nn.Module):
    def __init__(self, dim: int, codebook_size: int, num_quantizers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            VectorQuantization(dim, codebook_size) for _ in range(num_quantizers)
        )


class ResidualVectorQuantizer(nn.Module):
    """RVQ with 1x1-conv projections in and out of the codebook space."""

    def __init__(
        self,
        dimension: int,
        input_dimension: int | None,
        output_dimension: int | None,
        n_q: int,
        bins: int,
    ) -> None:
        super().__init__()
        self.dimension = dimension
        self.bins = bins
        self.max_n_q = n_q
        self.n_q = n_q
        # The split quantizer always projects, even when the dimensions agree.
        self.input_proj = nn.Conv1d(input_dimension or dimension, dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(dimension, output_dimension or dimension, 1, bias=False)
        self.vq = ResidualVectorQuantization(dimension, bins, n_q)
        self._centroids: Tensor | None = None  # [n_q, bins, dimension] float32
        self._augmented: Tensor | None = None  # [n_q, bins, dimension + 2] float32
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh_centroids())

    def refresh_centroids(self) -> None:
        """Recompute the cached float32 centroids from the codebook buffers."""
        centroids = torch.stack(
            [cast(VectorQuantization, layer)._codebook.centroids() for layer in self.vq.layers]
        )
        self._centroids = centroids
        # [c, 1, |c|^2] per centroid: the right operand of the one matmul that torch.cdist does
        # for Euclidean distances, precomputed once instead of on every call.
        sq_norms = centroids.pow(2).sum(-1, keepdim=True)
        self._augmented = torch.cat([centroids, torch.ones_like(sq_norms), sq_norms], dim=-1)

    def _apply(self, fn: Any, recurse: bool = True) -> ResidualVectorQuantizer:
        # Moving the module (device/dtype) must move the cache too; it is rebuilt from buffers.
        result = super()._apply(fn, recurse)
        self._centroids = self._augmented = None
        return result

    def centroids(self) -> Tensor:
        if self._centroids is None:
            self.refresh_centroids()
        assert self._centroids is not None
        return self._centroids

    def _distances(self, rows: Tensor, level: int) -> Tensor:
        """Euclidean distances [N, bins] of rows [N, D] to one level's centroids.

        Bit-identical to `torch.cdist(rows[None], centroids[None])[0]` (its matrix-multiply
        path: [-2x, |x|^2, 1] . [c, 1, |c|^2]), so nearest-centroid ties break exactly as the
        reference's do, at a third of the cost since the centroid side is cached.
        """
        assert self._augmented is not None
        sq_norms = rows.pow(2).sum(-1, keepdim=True)
        augmented_rows = torch.cat([rows.mul(-2), sq_norms, torch.ones_like(sq_norms)], dim=-1)
        squared = augmented_rows[None].matmul(self._augmented[level][None].mT)[0]
        return squared.clamp_min_(0).sqrt_()

    def encode(self, x: Tensor) -> Tensor:
        """Latent [B, input_dimension, T] -> codes [B, n_q, T] (int64)."""
        batch, _, length = x.shape
        if self.n_q == 0:
            return torch.empty(batch, 0, length, dtype=torch.long, device=x.device)
        projected = F.conv1d(x, self.input_proj.weight)
        # [B*T, D] rows, in the same (b, t) order the reference flattens them.
        residual = projected.transpose(1, 2).reshape(batch * length, self.dimension).float()
        centroids = self.centroids()
        codes = torch.empty(self.n_q, batch * length, dtype=torch.long, device=x.device)
        for level in range(self.n_q):
            torch.argmin(self._distances(residual, level), dim=-1, out=codes[level])
            residual = residual - F.embedding(codes[level], centroids[level])
        return codes.view(self.n_q, batch, length).transpose(0, 1)

    def decode_sum(self, codes: Tensor) -> Tensor:
        """Codes [B, k, T] (k <= n_q) -> sum of centroids [B, dimension, T] in float32."""
        levels = codes.shape[1]
        if levels > self.max_n_q:
            raise ValueError(f"got {levels} codebooks, the quantizer has {self.max_n_q}")
        centroids = self.centroids()[:levels]
        bins = centroids.shape[1]
        # One gather for all levels: flatten [levels, bins, D] and offset each level's codes.
        offsets = torch.arange(levels, device=codes.device).view(1, levels, 1) * bins
        flat = centroids.reshape(levels * bins, self.dimension)
        gathered = F.embedding(codes + offsets, flat)  # [B, k, T, D]
        return gathered.sum(dim=1).transpose(1, 2)

    def decode(self, codes: Tensor, dtype: torch.dtype) -> Tensor:
        summed = self.decode_sum(codes).to(dtype)
        return F.conv1d(summed, self.output_proj.weight)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(
        self,
        dimension: int = 256,
        n_q: int = 8,
        n_q_semantic: int = 1,
        bins: int = 1024,
        input_dimension: int | None = None,
        output_dimension: int | None = None,
        **training_only: Any,
    ) -> None:
        super().__init__()
        _reject_unknown(training_only)
        if n_q <= n_q_semantic:
            raise ValueError(f"n_q ({n_q}) must be larger than n_q_semantic ({n_q_semantic})")
        self.max_n_q = n_q
        self.n_q_semantic = n_q_semantic
        self.dimension = dimension
        self.bins = bins
        self.rvq_first = ResidualVectorQuantizer(
            dimension, input_dimension, output_dimension, n_q_semantic, bins
        )
        self.rvq_rest = ResidualVectorQuantizer(
            dimension, input_dimension, output_dimension, n_q - n_q_semantic, bins
        )

    @property
    def total_codebooks(self) -> int:
        return self.max_n_q

    @property
    def num_codebooks(self) -> int:
        return self.rvq_first.n_q + self.rvq_rest.n_q

    @property
    def cardinality(self) -> int:
        return self.bins

    def refresh_centroids(self) -> None:
        """Rebuild the cached centroid tables now (not lazily inside a first, maybe graphed,
        step)."""
        self.rvq_first.refresh_centroids()
        self.rvq_rest.refresh_centroids()

    def set_num_codebooks(self, n: int) -> None:
        if not self.n_q_semantic <= n <= self.max_n_q:
            raise ValueError(
                f"num_codebooks must be in [{self.n_q_semantic}, {self.max_n_q}], got {n}"
            )
        self.rvq_rest.n_q = n - self.n_q_semantic

    def encode(self, x: Tensor) -> Tensor:
        """Latent [B, C, T] -> codes [B, num_codebooks, T]."""
        codes = self.rvq_first.encode(x)
        if self.rvq_rest.n_q > 0:
            codes = torch.cat([codes, self.rvq_rest.encode(x)], dim=1)
        return codes

    def decode(self, codes: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Codes [B, k, T] -> quantized latent [B, output_dimension, T].

        All code values must lie in [0, bins); callers validate untrusted codes.
        """
        dtype = dtype or self.rvq_first.output_proj.weight.dtype
        out = self.rvq_first.decode(codes[:, : self.n_q_semantic], dtype)
        if codes.shape[1] > self.n_q_semantic:
            out = out + self.rvq_rest.decode(codes[:, self.n_q_semantic :], dtype)
        return out


def rename_legacy_codebook_keys(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Map old EMA buffer names (`embed_avg`, `cluster_size`, ...) to the current ones."""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        prefix, _, leaf = key.rpartition(".")
        if prefix.endswith("._codebook") and leaf in LEGACY_BUFFER_NAMES:
            key = f"{prefix}.{LEGACY_BUFFER_NAMES[leaf]}"
        out[key] = value
    return out


_TRAINING_ONLY_KEYS = {
    "q_dropout",
    "no_quantization_rate",
    "decay",
    "threshold_usage_ratio",
    "replaced_usage_ratio",
    "force_projection",
    "codebook_offset",
}


def _reject_unknown(extra: dict[str, Any]) -> None:
    unknown = sorted(set(extra) - _TRAINING_ONLY_KEYS)
    if unknown:
        raise TypeError(f"unexpected quantizer config keys: {unknown}")
