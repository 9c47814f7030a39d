"""The Moshi / PersonaPlex language model: temporal transformer + depformer.

Module names and shapes follow the reference `moshi.models.lm.LMModel` so a released
`model.safetensors` loads unchanged, for both layouts:

- Moshi: `n_q` 16 input streams (8 agent + 8 user), `dep_q` 8 (the depformer predicts the
  agent codebooks);
- PersonaPlex: same streams, `dep_q` 16 (the depformer also has weights for the user
  codebooks). At serving time the user codebooks come from the microphone, so only the agent
  part of the depformer needs to run (it is causal over codebooks).

Per frame the temporal transformer consumes the sum of the text and audio embeddings of one
column of tokens; the depformer then produces the agent codebooks one by one. How tokens are
scheduled (delays, forcing, sampling) lives in `lm_stepper.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from agent.plugins.personaplex.transformer import StreamingTransformer, make_norm

ZERO_TOKEN_ID = -1  # an input position that contributes no embedding at all


def agent_codebooks(n_q: int, dep_q: int) -> int:
    """Agent audio codebooks per frame. Moshi (dep_q < n_q): the depformer predicts exactly
    the agent stream. PersonaPlex (dep_q == n_q): it predicts agent then user streams, which
    have the same size."""
    return dep_q if dep_q < n_q else n_q // 2


class ScaledEmbedding(nn.Embedding):
    """Embedding with the reference's options: -1 gives a zero vector, optional layer norm,
    optional low-rank factorisation, optional demuxing of two text streams."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        norm: bool = False,
        low_rank: int | None = None,
        demux_second_stream: bool = False,
    ) -> None:
        super().__init__(num_embeddings, low_rank or embedding_dim)
        self.norm = make_norm("layer_norm", self.embedding_dim) if norm else None
        self.low_rank = (
            nn.Linear(low_rank, embedding_dim, bias=False) if low_rank is not None else None
        )
        self.demux_second_stream = demux_second_stream
        if demux_second_stream:
            if norm:
                raise ValueError("demux_second_stream cannot be combined with norm_emb")
            self.out1 = nn.Linear(low_rank or embedding_dim, embedding_dim, bias=False)
            self.out2 = nn.Linear(low_rank or embedding_dim, embedding_dim, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        is_zero = (tokens == ZERO_TOKEN_ID)[..., None]
        tokens = tokens.clamp(min=0)
        if self.demux_second_stream:
            left = super().forward(tokens % self.num_embeddings)
            right = tokens // self.num_embeddings - 1  # -1 means "no second token"
            right_missing = (right < 0)[..., None]
            right = super().forward(right.clamp(min=0))
            y = self.out1(left) + torch.where(right_missing, 0.0, self.out2(right))
            return torch.where(is_zero, 0.0, y)
        y = super().forward(tokens)
        if self.norm is not None:
            y = self.norm(y)
        y = torch.where(is_zero, 0.0, y)
        if self.low_rank is not None:
            y = self.low_rank(y)
        return y


class LMModel(nn.Module):
    """Keyword arguments are those of the reference `LMModel` (as in a checkpoint's config.json)."""

    def __init__(
        self,
        delays: Sequence[int] = (0,),
        n_q: int = 8,
        dep_q: int = 8,
        card: int = 1024,
        text_card: int = 32000,
        text_card_out: int | None = None,
        demux_second_text_stream: bool = False,
        dim: int = 128,
        num_heads: int = 8,
        hidden_scale: float = 4,
        norm: str = "layer_norm",
        norm_emb: bool = False,
        bias_proj: bool = False,
        depformer_dim: int = 256,
        depformer_dim_feedforward: int | list[int] | None = None,
        depformer_multi_linear: bool = False,
        depformer_weights_per_step: bool = False,
        depformer_weights_per_step_schedule: list[int] | None = None,
        depformer_low_rank_embeddings: int | None = None,
        depformer_pos_emb: str = "sin",
        depformer_norm: str | None = None,
        existing_text_padding_id: int = 3,
        existing_text_end_padding_id: int = 0,
        extra_heads_num_heads: int = 0,
        extra_heads_dim: int = 6,
        context: int | None = None,
        causal: bool = True,
        condition_provider: Any = None,
        fuser: Any = None,
        quantize: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        gradient_checkpointing: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if condition_provider is not None or fuser is not None:
            raise ValueError("conditioned LMs (condition_provider / fuser) are not supported")
        if quantize:
            raise ValueError("quantized LM checkpoints are not supported")
        if len(delays) != n_q + 1:
            raise ValueError(f"expected {n_q + 1} delays, got {len(delays)}")
        if dep_q < 1:
            raise ValueError("a depformer (dep_q >= 1) is required")
        if (
            depformer_weights_per_step_schedule is not None
            and len(depformer_weights_per_step_schedule) != dep_q
        ):
            raise ValueError("depformer_weights_per_step_schedule must have dep_q entries")
        self.n_q = n_q
        self.dep_q = dep_q
        self.card = card
        self.text_card = text_card
        self.delays = list(delays)
        self.dim = dim
        self.existing_text_padding_id = existing_text_padding_id
        self.existing_text_end_padding_id = existing_text_end_padding_id
        self.context = context
        self.depformer_multi_linear = depformer_multi_linear
        self.depformer_weights_per_step_schedule = depformer_weights_per_step_schedule

        self.emb = nn.ModuleList(ScaledEmbedding(card + 1, dim, norm=norm_emb) for _ in range(n_q))
        self.text_emb = ScaledEmbedding(
            text_card + 1, dim, norm=norm_emb, demux_second_stream=demux_second_text_stream
        )
        self.text_linear = nn.Linear(
            dim, text_card if text_card_out is None else text_card_out, bias=bias_proj
        )

        prefix = "depformer_"
        main_kwargs = {k: v for k, v in kwargs.items() if not k.startswith(prefix)}
        self.transformer = StreamingTransformer(
            d_model=dim,
            num_heads=num_heads,
            dim_feedforward=int(hidden_scale * dim),
            norm=norm,
            context=context,
            causal=causal,
            checkpointing=gradient_checkpointing,
            **main_kwargs,
        )
        self.out_norm = make_norm(norm, dim)

        dep_kwargs = dict(main_kwargs)
        dep_kwargs.update(
            {k.removeprefix(prefix): v for k, v in kwargs.items() if k.startswith(prefix)}
        )
        dep_kwargs["positional_embedding"] = depformer_pos_emb
        dep_kwargs["context"] = None  # the depformer only ever sees the codebooks of one frame
        dep_kwargs.pop("cross_attention", None)
        if depformer_weights_per_step:
            dep_kwargs["weights_per_step"] = dep_q
        num_in = 1
        if depformer_multi_linear:
            num_in = (
                max(depformer_weights_per_step_schedule) + 1
                if depformer_weights_per_step_schedule
                else dep_q
            )
        self.depformer_in = nn.ModuleList(
            nn.Linear(dim, depformer_dim, bias=False) for _ in range(num_in)
        )
        # The last codebook is never a depformer input, hence dep_q - 1 embeddings.
        self.depformer_emb = nn.ModuleList(
            ScaledEmbedding(
                card + 1, depformer_dim, norm=norm_emb, low_rank=depformer_low_rank_embeddings
            )
            for _ in range(dep_q - 1)
        )
        self.depformer_text_emb = ScaledEmbedding(
            text_card + 1,
            depformer_dim,
            norm=norm_emb,
            low_rank=depformer_low_rank_embeddings,
            demux_second_stream=demux_second_text_stream,
        )
        self.depformer_norms = nn.ModuleList(
            nn.Identity() if depformer_norm is None else make_norm(depformer_norm, depformer_dim)
            for _ in range(dep_q)
        )
        if depformer_dim_feedforward is None:
            depformer_dim_feedforward = int(hidden_scale * depformer_dim)
        self.depformer = StreamingTransformer(
            d_model=depformer_dim,
            dim_feedforward=depformer_dim_feedforward,
            norm=norm,
            weights_per_step_schedule=depformer_weights_per_step_schedule,
            causal=causal,
            checkpointing=gradient_checkpointing,
            **dep_kwargs,
        )
        self.extra_heads = nn.ModuleList(
            nn.Linear(dim, extra_heads_dim, bias=False) for _ in range(extra_heads_num_heads)
        )
        self.linears = nn.ModuleList(
            nn.Linear(depformer_dim, card, bias=bias_proj) for _ in range(dep_q)
        )
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    # ------------------------------------------------------------------ layout facts

    @property
    def num_codebooks(self) -> int:
        """Token rows per frame: text + n_q audio streams."""
        return self.n_q + 1

    @property
    def num_agent_codebooks(self) -> int:
        """Agent audio codebooks the stepper generates (Moshi: dep_q; PersonaPlex: n_q / 2)."""
        return agent_codebooks(self.n_q, self.dep_q)

    @property
    def num_user_codebooks(self) -> int:
        return self.n_q - self.num_agent_codebooks

    @property
    def initial_token_id(self) -> int:
        return self.card

    @property
    def text_initial_token_id(self) -> int:
        return self.text_card

    @property
    def text_padding_token_id(self) -> int:
        return self.existing_text_padding_id

    @property
    def device(self) -> torch.device:
        return self.text_linear.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_emb.weight.dtype

    def initial_tokens(self) -> torch.Tensor:
        """[K] the "nothing yet" token of each row."""
        tokens = torch.full(
            (self.num_codebooks,), self.initial_token_id, dtype=torch.long, device=self.device
        )
        tokens[0] = self.text_initial_token_id
        return tokens

    # ------------------------------------------------------------------ compute

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K] (one column: text first) -> temporal transformer input [B, 1, dim]."""
        codes = codes[:, :, None]
        total = self.emb[0](codes[:, 1])
        for index in range(1, self.n_q):
            total = total + self.emb[index](codes[:, 1 + index])
        return total + self.text_emb(codes[:, 0])

    def forward_embeddings(
        self, embeddings: torch.Tensor, active: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, 1, dim] -> (normed transformer output [B, 1, dim], text logits
        [B, text_card_out])."""
        out = self.out_norm(self.transformer(embeddings, active=active))
        return out, self.text_linear(out)[:, 0]

    def depformer_logits(
        self, step: int, prev_token: torch.Tensor, transformer_out: torch.Tensor
    ) -> torch.Tensor:
        """Logits [B, card] of depformer codebook `step`, given the previous token [B]
        (the text token for step 0). Steps must run 0, 1, 2, ... within a frame."""
        if self.depformer.state is None:
            raise RuntimeError("depformer_logits needs streaming state (start_streaming first)")
        if step == 0:
            self.depformer.state["offset"].zero_()  # each frame is a fresh codebook sequence
        in_index = 0
        if self.depformer_multi_linear:
            schedule = self.depformer_weights_per_step_schedule
            in_index = schedule[step] if schedule is not None else step
        x = self.depformer_in[in_index](transformer_out)
        token = prev_token[:, None]
        x = x + (
            self.depformer_text_emb(token) if step == 0 else self.depformer_emb[step - 1](token)
        )
        y = self.depformer(x, weights_step=step)
        return self.linears[step](self.depformer_norms[step](y))[:, 0]
