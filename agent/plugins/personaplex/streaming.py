"""The one streaming protocol every stateful layer speaks.

A `StreamingModule` keeps its state as a dict of tensors whose first dimension is the batch
slot. Between calls that state carries over (conv history, KV cache, positions). Because every
layer stores state the same way, three generic operations work on a whole model tree:

- `start_streaming(model, batch_size)`: allocate fresh state for `batch_size` slots;
- `reset_slots(model, mask)`: put the masked slots back to their fresh state, others untouched;
- `export_slot` / `import_slot`: copy one slot's state out (a snapshot) or into another slot.

So model code stays pure: a layer only says how to build its fresh state (`init_state`) and
how to compute with `self.state` during `forward`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

SlotSnapshot = dict[str, torch.Tensor]


class StreamingModule(nn.Module):
    """A layer with per-slot state. `self.state` is None when not streaming."""

    def __init__(self) -> None:
        super().__init__()
        self.state: dict[str, torch.Tensor] | None = None

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        """Fresh state for `batch_size` slots; every tensor has the slot as dim 0."""
        return {}

    @property
    def is_streaming(self) -> bool:
        return self.state is not None

    def export_slot_state(self, slot: int) -> dict[str, torch.Tensor]:
        """A copy of one slot's state. Layers whose state is mostly unused space (a KV cache
        early in a call) override this to store only what is filled."""
        assert self.state is not None
        return {key: value[slot].clone() for key, value in self.state.items()}

    def import_slot_state(self, slot: int, snapshot: dict[str, torch.Tensor]) -> None:
        """Inverse of `export_slot_state`: overwrite one slot's state in place."""
        assert self.state is not None
        for key, value in self.state.items():
            value[slot].copy_(snapshot[key])

    def reset_state_slots(self, mask: torch.Tensor) -> None:
        """Put the masked slots back to their fresh state. Layers with big state (KV caches)
        override this to reset in place instead of building a whole fresh state."""
        assert self.state is not None
        fresh = self.init_state(int(mask.shape[0]))
        for key, value in self.state.items():
            slot_mask = mask.to(value.device)
            value[slot_mask] = fresh[key][slot_mask].to(value.dtype)


def streaming_modules(model: nn.Module) -> Iterator[tuple[str, StreamingModule]]:
    for name, module in model.named_modules():
        if isinstance(module, StreamingModule):
            yield name, module


def start_streaming(model: nn.Module, batch_size: int) -> None:
    for _, module in streaming_modules(model):
        module.state = module.init_state(batch_size)


def stop_streaming(model: nn.Module) -> None:
    for _, module in streaming_modules(model):
        module.state = None


def reset_slots(model: nn.Module, mask: torch.Tensor) -> None:
    """Reset the slots where `mask` (bool, [B]) is True to their fresh state."""
    for _, module in streaming_modules(model):
        if module.state is None:
            continue
        module.reset_state_slots(mask)


def export_slot(model: nn.Module, slot: int) -> SlotSnapshot:
    snapshot: SlotSnapshot = {}
    for name, module in streaming_modules(model):
        if module.state is None:
            continue
        for key, value in module.export_slot_state(slot).items():
            snapshot[f"{name}:{key}"] = value
    return snapshot


def import_slot(model: nn.Module, slot: int, snapshot: SlotSnapshot) -> None:
    for name, module in streaming_modules(model):
        if module.state is None:
            continue
        module.import_slot_state(slot, {key: snapshot[f"{name}:{key}"] for key in module.state})
