"""`LMStepper.step` replayed as a CUDA graph (fixed batch size), eager on other devices.

A 7B step launches a few thousand small kernels (32 temporal layers, then 8 depformer steps
of 6 layers each); on a GPU, launching them from Python costs more than running them. The
step is written to be capturable: every state update is in place, there is no host sync,
and all inputs are tensors of fixed shape. This wrapper keeps static input buffers, copies
each call's inputs into them and replays the graph.

Capturing needs a warm-up run first. Warming up with every slot frozen (`active` all
False) leaves all slot state exactly as it was (the stepper guarantees frozen slots are
untouched; the depformer's per-frame scratch is rebuilt every frame), so a graph can be
captured at any time, even with live sessions, without copying any KV cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from agent.plugins.personaplex.lm_stepper import NOT_FORCED, LMStepOutput
from agent.plugins.personaplex.sampling import SamplingConfig

if TYPE_CHECKING:
    from agent.plugins.personaplex.lm import LMModel


class Stepping(Protocol):
    """What GraphedLMStep uses of its `LMStepper` (or of stepper.py's prefix-width adapter)."""

    @property
    def lm(self) -> LMModel: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def n_user(self) -> int: ...
    @property
    def n_agent(self) -> int: ...
    @property
    def sampling(self) -> SamplingConfig: ...

    def step(
        self,
        user_codes: torch.Tensor | None,
        forced_text: torch.Tensor | None = None,
        forced_agent: torch.Tensor | None = None,
        input_embeddings: torch.Tensor | None = None,
        embeddings_mask: torch.Tensor | None = None,
        active: torch.Tensor | None = None,
    ) -> LMStepOutput: ...


class GraphedLMStep:
    """Call like `LMStepper.step`; one graph per sampling configuration, built on first use."""

    def __init__(self, stepper: Stepping, use_graph: bool | None = None) -> None:
        self.stepper = stepper
        lm = stepper.lm
        device = lm.device
        batch = stepper.batch_size
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        if self.use_graph and device.type != "cuda":
            raise ValueError("CUDA graphs need the LM on a CUDA device")
        self.user_codes = torch.zeros(batch, stepper.n_user, dtype=torch.long, device=device)
        self.forced_text = torch.full((batch,), NOT_FORCED, dtype=torch.long, device=device)
        self.forced_agent = torch.full(
            (batch, stepper.n_agent), NOT_FORCED, dtype=torch.long, device=device
        )
        self.input_embeddings = torch.zeros(batch, lm.dim, dtype=lm.dtype, device=device)
        self.embeddings_mask = torch.zeros(batch, dtype=torch.bool, device=device)
        self.active = torch.ones(batch, dtype=torch.bool, device=device)
        self._graphs: dict[SamplingConfig, tuple[torch.cuda.CUDAGraph, LMStepOutput]] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None  # (torch's own name for the type)

    def _load_inputs(
        self,
        user_codes: torch.Tensor | None,
        forced_text: torch.Tensor | None,
        forced_agent: torch.Tensor | None,
        input_embeddings: torch.Tensor | None,
        embeddings_mask: torch.Tensor | None,
        active: torch.Tensor | None,
    ) -> None:
        if user_codes is not None:
            self.user_codes.copy_(user_codes[:, : self.stepper.n_user])
        elif self.stepper.n_user:
            raise ValueError("user_codes are required for this model")
        if forced_text is None:
            self.forced_text.fill_(NOT_FORCED)
        else:
            self.forced_text.copy_(forced_text)
        if forced_agent is None:
            self.forced_agent.fill_(NOT_FORCED)
        else:
            self.forced_agent.copy_(forced_agent)
        if input_embeddings is None:
            self.embeddings_mask.fill_(False)
        else:
            if embeddings_mask is None:
                raise ValueError("embeddings_mask is required with input_embeddings")
            self.input_embeddings.copy_(input_embeddings.view_as(self.input_embeddings))
            self.embeddings_mask.copy_(embeddings_mask)
        if active is None:
            self.active.fill_(True)
        else:
            self.active.copy_(active)

    def _eager(self) -> LMStepOutput:
        return self.stepper.step(
            self.user_codes,
            forced_text=self.forced_text,
            forced_agent=self.forced_agent,
            input_embeddings=self.input_embeddings,
            embeddings_mask=self.embeddings_mask,
            active=self.active,
        )

    def _capture(self) -> tuple[torch.cuda.CUDAGraph, LMStepOutput]:
        requested = self.active.clone()
        self.active.fill_(False)  # warm-up runs must not move any slot
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._eager()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._eager()
        self._pool = graph.pool()
        self.active.copy_(requested)
        return graph, outputs

    @torch.no_grad()
    def step(
        self,
        user_codes: torch.Tensor | None,
        forced_text: torch.Tensor | None = None,
        forced_agent: torch.Tensor | None = None,
        input_embeddings: torch.Tensor | None = None,
        embeddings_mask: torch.Tensor | None = None,
        active: torch.Tensor | None = None,
    ) -> LMStepOutput:
        self._load_inputs(
            user_codes, forced_text, forced_agent, input_embeddings, embeddings_mask, active
        )
        if not self.use_graph:
            return self._eager()
        config = self.stepper.sampling
        if config not in self._graphs:
            self._graphs[config] = self._capture()
        graph, outputs = self._graphs[config]
        graph.replay()
        # The graph's output buffers are overwritten by the next replay.
        return LMStepOutput(
            text_tokens=outputs.text_tokens.clone(),
            audio_codes=outputs.audio_codes.clone(),
            audio_valid=outputs.audio_valid.clone(),
            aligned_text=outputs.aligned_text.clone(),
        )
