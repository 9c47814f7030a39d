"""Streaming Mimi encode/decode replayed as CUDA graphs (one per input shape), eager elsewhere.

One Mimi encode + decode launches several hundred small kernels (SEANet convs, two 8-layer
transformers, eight codebook searches); on a GPU the Python launch cost exceeds the work at
small batches. Mimi's streaming step is capturable: every state update is in place, there
are no host syncs, and the centroid tables are built at load time.

A graph bakes in the addresses of the state tensors, so it stays valid while those tensors
live: slot resets, `import_slot` and prefix views (`state[:n]`, same storage) are fine; a new
`start_streaming` allocates new state, which is detected and triggers a fresh capture.

Capturing needs warm-up runs that advance the streaming state; the state is saved before and
restored after, so a capture can happen with live slots (once per input shape).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agent.plugins.personaplex.mimi import MimiModel
from agent.plugins.personaplex.streaming import StreamingModule, streaming_modules

StateTensors = list[torch.Tensor]


def streaming_layers(model: torch.nn.Module) -> list[StreamingModule]:
    return [module for _, module in streaming_modules(model)]


def state_tensors(layers: list[StreamingModule]) -> StateTensors:
    """Every streaming state tensor of `layers`, in a fixed order."""
    tensors: StateTensors = []
    for module in layers:
        if module.state is not None:
            tensors.extend(module.state[key] for key in sorted(module.state))
    return tensors


def save_state(layers: list[StreamingModule]) -> StateTensors:
    return [tensor.clone() for tensor in state_tensors(layers)]


def restore_state(layers: list[StreamingModule], saved: StateTensors) -> None:
    current = state_tensors(layers)
    if len(current) != len(saved):
        raise RuntimeError("streaming state layout changed between save and restore")
    for tensor, value in zip(current, saved, strict=True):
        tensor.copy_(value)


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    static_input: torch.Tensor
    static_active: torch.Tensor
    static_output: torch.Tensor
    addresses: tuple[int, ...]


Step = Callable[..., torch.Tensor]


class GraphedMimi:
    """`encode`/`decode` with the same contract as `MimiModel`'s, while streaming."""

    def __init__(self, mimi: MimiModel, use_graph: bool | None = None) -> None:
        device = next(mimi.parameters()).device
        self.mimi = mimi
        self.layers = streaming_layers(mimi)
        self.use_graph = device.type == "cuda" if use_graph is None else use_graph
        if self.use_graph and device.type != "cuda":
            raise ValueError("CUDA graphs need Mimi on a CUDA device")
        self._graphs: dict[tuple[object, ...], _Captured] = {}
        self._pool: torch.cuda._POOL_HANDLE | None = None  # (torch's own name for the type)

    @torch.no_grad()
    def encode(self, audio: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Audio [B, 1, frame_size * n] -> codes [B, K, n]; `active` as in `MimiModel.encode`."""
        return self._run("encode", self.mimi.encode, audio, active)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, active: torch.Tensor | None = None) -> torch.Tensor:
        """Codes [B, K, n] -> audio [B, 1, frame_size * n]; `active` as in `MimiModel.decode`."""
        return self._run("decode", self.mimi.decode, codes, active)

    def clear(self) -> None:
        """Drop every captured graph (and its memory pool)."""
        self._graphs.clear()
        self._pool = None

    def _run(
        self, kind: str, step: Step, x: torch.Tensor, active: torch.Tensor | None
    ) -> torch.Tensor:
        if not self.use_graph:
            return step(x, active=active)
        if not self.mimi.is_streaming:
            raise RuntimeError(
                "GraphedMimi replays streaming steps: call start_streaming(mimi, B) first"
            )
        key = (kind, tuple(x.shape), x.dtype, x.device)
        addresses = tuple(tensor.data_ptr() for tensor in state_tensors(self.layers))
        captured = self._graphs.get(key)
        if captured is None or captured.addresses != addresses:
            captured = self._capture(step, x, addresses)
            self._graphs[key] = captured
        captured.static_input.copy_(x)
        # One graph serves both cases: "no mask" is an all-true mask.
        if active is None:
            captured.static_active.fill_(True)
        else:
            captured.static_active.copy_(active)
        captured.graph.replay()
        # The output buffer is overwritten by the next replay.
        return captured.static_output.clone()

    def _capture(self, step: Step, x: torch.Tensor, addresses: tuple[int, ...]) -> _Captured:
        static_input = x.clone()
        static_active = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        saved = save_state(self.layers)
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                step(static_input, active=static_active)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_output = step(static_input, active=static_active)
        self._pool = graph.pool()
        restore_state(self.layers, saved)
        return _Captured(graph, static_input, static_active, static_output, addresses)
