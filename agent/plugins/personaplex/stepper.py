"""The batched full step: B input frames in, B output frames + B text tokens out.

One tick: Mimi-encode the B user frames -> one LM step for every slot (the user's codes in,
text + agent codes out, de-delayed) -> Mimi-decode the agent codes -> B frames of 1920 samples.

Slots are kept packed: the sessions of a stepper always occupy slots 0..n-1, so a tick only
computes n rows, not the allocated capacity (a leave moves the last slot into the hole, one
slot copy). Each layer's state is sliced to that prefix for the step (`state_prefix`): views
share storage, so in-place state updates land in the full tensors directly.

A session's result does not depend on its slot or on the others in the batch: every row of
every layer is computed independently, and sampling noise is keyed by the slot's own seed and
position (sampling.py), so greedy tokens in a batch equal tokens stepped alone.

On CUDA the LM step and the Mimi encode/decode are replayed as CUDA graphs (lm_graph.py,
mimi_graph.py), which need fixed shapes: the stepped prefix is then rounded up to a power of
two ("bucketed"), so at most log2(capacity) + 1 graphs exist per sampling configuration. The
extra rows are free slots: the LM leaves them untouched (inactive), and their codec state is
reset when a session takes the slot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_graph import GraphedLMStep
from agent.plugins.personaplex.lm_stepper import LMStepOutput, LMStepper
from agent.plugins.personaplex.mimi import MimiModel
from agent.plugins.personaplex.mimi_graph import GraphedMimi
from agent.plugins.personaplex.sampling import SamplingConfig

GREEDY = SamplingConfig()


@contextmanager
def state_prefix(modules: Sequence[streaming.StreamingModule], count: int) -> Iterator[None]:
    """Within the block each of `modules` sees only its slots [0, count)."""
    swapped: list[tuple[streaming.StreamingModule, dict[str, torch.Tensor]]] = []
    for module in modules:
        full = module.state
        if full is None or next(iter(full.values())).shape[0] == count:
            continue
        module.state = {key: value[:count] for key, value in full.items()}
        swapped.append((module, full))
    try:
        yield
    finally:
        for module, full in swapped:
            current = module.state or {}
            for key, value in current.items():
                target = full[key][:count]
                # A layer that rebinds a state entry instead of writing in place left a new tensor.
                if value.data_ptr() != target.data_ptr():
                    target.copy_(value)
            module.state = full


def bucket_width(count: int, capacity: int) -> int:
    """The smallest power of two >= count, capped at capacity."""
    width = 1
    while width < count:
        width *= 2
    return min(width, capacity)


class _PrefixStepper:
    """Adapter for GraphedLMStep, which sizes its static buffers from `stepper.batch_size`:
    one graphed step serves one prefix width of the packed slots of the real stepper."""

    # Read from the wrapped stepper through __getattr__ (declared for the type checker).
    lm: LMModel
    n_user: int
    n_agent: int
    sampling: SamplingConfig
    step: Callable[..., LMStepOutput]

    def __init__(self, stepper: LMStepper, width: int) -> None:
        self._stepper = stepper
        self.batch_size = width

    def __getattr__(self, name: str) -> object:
        return getattr(self._stepper, name)


def decoder_modules(mimi: MimiModel) -> list[nn.Module]:
    """The layers with state on Mimi's decode path (codes -> waveform)."""
    return [m for m in (mimi.upsample, mimi.decoder_transformer, mimi.decoder) if m is not None]


@dataclass(eq=False)
class SlotHandle:
    """A session's seat in the stepper. `slot` moves when another session leaves."""

    slot: int
    sampling: SamplingConfig = GREEDY
    closed: bool = False


@dataclass
class FrameResult:
    """One tick's output for one slot."""

    audio: np.ndarray  # float32 [frame_size]
    text_token: int | None  # aligned with `audio`; None before the first output frame
    audio_codes: list[int] | None  # the agent's Mimi codes; None before the first output frame
    user_codes: list[int]


class BatchedStepper:
    """Owns the live (batched) streaming state of one LM + Mimi pair."""

    def __init__(self, lm: LMModel, mimi: MimiModel, capacity: int, graphs: bool | None = None,
                 bucketed: bool | None = None) -> None:
        """`graphs`: replay CUDA graphs (default: on CUDA). `bucketed`: step power-of-two
        prefixes (default: when graphs are on; settable alone to test the same path on CPU)."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.lm = lm
        self.mimi = mimi
        self.capacity = capacity
        self.lm_stepper = LMStepper(lm, capacity, GREEDY)
        streaming.start_streaming(mimi, capacity)
        self.frame_size = mimi.frame_size
        self.n_user = lm.num_user_codebooks
        self.n_agent = lm.num_agent_codebooks
        self.handles: list[SlotHandle] = []  # handles[i].slot == i
        self.device = lm.device
        # Module lists are walked every tick: collect them once.
        self._stateful = [m for _, m in streaming.streaming_modules(mimi)] + [
            m for _, m in streaming.streaming_modules(self.lm_stepper)
        ]
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.bucketed = self.graphs if bucketed is None else bucketed
        if self.graphs and not self.bucketed:
            raise ValueError("CUDA graphs need bucketed (fixed) batch widths")
        self.codec: MimiModel | GraphedMimi = (
            GraphedMimi(mimi, use_graph=True) if self.graphs else mimi
        )
        self._graphed_lm: dict[int, GraphedLMStep] = {}

    @property
    def free_slots(self) -> int:
        return self.capacity - len(self.handles)

    # ------------------------------------------------------------------ joins and leaves

    def acquire(self, snapshot: streaming.SlotSnapshot | None, sampling: SamplingConfig = GREEDY,
                seed: int = 0) -> SlotHandle:
        """Seat a new session at the end of the packed slots, starting from `snapshot`
        (an `LMStepper` slot export taken after the prompt; None = fresh)."""
        if not self.free_slots:
            raise RuntimeError("no free slot")
        handle = SlotHandle(slot=len(self.handles), sampling=sampling)
        self.handles.append(handle)
        self.load(handle, snapshot, seed)
        return handle

    @torch.no_grad()
    def load(
        self, handle: SlotHandle, snapshot: streaming.SlotSnapshot | None, seed: int = 0
    ) -> None:
        """Put a seated session back to `snapshot` (also a restart), with a fresh codec state."""
        mask = torch.zeros(self.capacity, dtype=torch.bool, device=self.device)
        mask[handle.slot] = True
        streaming.reset_slots(self.mimi, mask)
        if snapshot is None:
            self.lm_stepper.reset_slots(mask)
        else:
            self.lm_stepper.import_slot(handle.slot, snapshot)
        assert self.lm_stepper.state is not None
        self.lm_stepper.state["seed"][handle.slot] = seed

    @torch.no_grad()
    def release(self, handle: SlotHandle) -> None:
        """Free a seat; the last packed slot moves into the hole."""
        if handle.closed:
            return
        handle.closed = True
        last = self.handles.pop()
        if last is handle:
            return
        hole = handle.slot
        # Slot to slot in place: no temporary copy of a KV cache (about 1.6 GB per slot at 7B).
        for module in self._stateful:
            for value in (module.state or {}).values():
                value[hole].copy_(value[last.slot])
        last.slot = hole
        self.handles[hole] = last

    # ------------------------------------------------------------------ the tick

    @torch.no_grad()
    def step(self, handles: Sequence[SlotHandle], frames: np.ndarray) -> list[FrameResult]:
        """Advance the given sessions one frame. `frames` [len(handles), frame_size] float32.

        Every seated session is normally in `handles`; a seated one left out is not advanced
        (its LM slot is frozen and its codec state restored)."""
        if len(handles) == 0:
            return []
        if frames.shape != (len(handles), self.frame_size):
            raise ValueError(
                f"frames must be [{len(handles)}, {self.frame_size}], got {frames.shape}"
            )
        count = max(h.slot for h in handles) + 1
        if self.bucketed:
            count = bucket_width(count, self.capacity)
        rows = torch.tensor([h.slot for h in handles], device=self.device)
        audio_in = torch.zeros(count, 1, self.frame_size, dtype=self.mimi_dtype, device=self.device)
        audio_in[rows, 0] = torch.from_numpy(np.ascontiguousarray(frames)).to(
            device=self.device, dtype=self.mimi_dtype
        )
        seated = len(self.handles)
        skipped = sorted(set(range(min(count, seated))) - {h.slot for h in handles})
        saved_codec = {slot: streaming.export_slot(self.mimi, slot) for slot in skipped}

        with state_prefix(self._stateful, count):
            user_codes = self.codec.encode(audio_in)[:, : self.n_user, 0]
            text, codes, valid = self._lm_step(handles, count, user_codes, count > len(handles))
            audio_out = self._decode(codes, valid)

        for slot, snapshot in saved_codec.items():
            streaming.import_slot(self.mimi, slot, snapshot)
        return self._results(handles, audio_out, text, codes, valid, user_codes)

    @property
    def mimi_dtype(self) -> torch.dtype:
        return next(self.mimi.parameters()).dtype

    def _lm_step(
        self,
        handles: Sequence[SlotHandle],
        count: int,
        user_codes: torch.Tensor,
        any_skipped: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One LM step per distinct sampling config in the batch (normally exactly one)."""
        groups: dict[SamplingConfig, list[int]] = {}
        for handle in handles:
            groups.setdefault(handle.sampling, []).append(handle.slot)
        text = torch.zeros(count, dtype=torch.long, device=self.device)
        codes = torch.zeros(count, self.n_agent, dtype=torch.long, device=self.device)
        valid = torch.zeros(count, dtype=torch.bool, device=self.device)
        for config, slots in groups.items():
            active = None
            if len(groups) > 1 or any_skipped:
                active = torch.zeros(count, dtype=torch.bool, device=self.device)
                active[slots] = True
            self.lm_stepper.sampling = config
            out = self._lm_forward(count, user_codes, active)
            chosen = torch.tensor(slots, device=self.device)
            text[chosen] = out.aligned_text[chosen]
            codes[chosen] = out.audio_codes[chosen]
            valid[chosen] = out.audio_valid[chosen]
        return text, codes, valid

    def _lm_forward(
        self, width: int, user_codes: torch.Tensor, active: torch.Tensor | None
    ) -> LMStepOutput:
        if not self.graphs:
            return self.lm_stepper.step(user_codes, active=active)
        graphed = self._graphed_lm.get(width)
        if graphed is None:
            adapter = _PrefixStepper(self.lm_stepper, width)
            graphed = GraphedLMStep(adapter, use_graph=True)
            self._graphed_lm[width] = graphed
        return graphed.step(user_codes, active=active)

    def _decode(self, codes: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Waveforms [count, frame_size]; silence (and an untouched decoder) where not valid."""
        count = codes.shape[0]
        if not bool(valid.any()):
            return torch.zeros(count, self.frame_size, device=self.device)
        safe_codes = torch.where(valid[:, None], codes, 0)
        audio = self.codec.decode(safe_codes[:, :, None])[:, 0].float()
        if not bool(valid.all()):
            # A slot with no frame yet must look as if the decoder never ran for it.
            for module in decoder_modules(self.mimi):
                streaming.reset_slots(module, ~valid)
            audio = torch.where(valid[:, None], audio, 0.0)
        return audio

    def _results(
        self,
        handles: Sequence[SlotHandle],
        audio: torch.Tensor,
        text: torch.Tensor,
        codes: torch.Tensor,
        valid: torch.Tensor,
        user_codes: torch.Tensor,
    ) -> list[FrameResult]:
        audio_np = audio.clamp(-1.0, 1.0).cpu().numpy().astype(np.float32, copy=False)
        text_list = text.cpu().tolist()
        codes_list = codes.cpu().tolist()
        valid_list = valid.cpu().tolist()
        user_list = user_codes.cpu().tolist()
        results = []
        for handle in handles:
            slot = handle.slot
            ok = valid_list[slot]
            results.append(FrameResult(
                audio=audio_np[slot].copy(),
                text_token=text_list[slot] if ok else None,
                audio_codes=codes_list[slot] if ok else None,
                user_codes=user_list[slot],
            ))
        return results
