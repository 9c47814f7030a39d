"""The PersonaPlex prompt (prefill) and its per-(voice, persona) snapshots.

Prefill, as the released model was trained to see it:
1. the voice prompt: from a `.pt` file, T stored input embeddings replayed through the
   temporal transformer, then the saved token cache restored; from audio (a `.wav`, see
   voice_audio.py), its T frames of Mimi codes forced on the agent rows (user rows = sine
   tokens, text = pad), which is how NVIDIA's reference made the `.pt` files;
2. 6 silence frames (agent rows = Mimi silence tokens, user rows = sine tokens, text = pad);
3. the persona `<system> ... <system>`, SentencePiece tokens forced on the text row, one per
   frame (agent silence, user sine);
4. 6 more silence frames.

The state after the prompt depends only on (model, voice, persona), so it is computed once and
kept as an `LMStepper` slot export; opening a call copies it into the call's slot (one slot
copy, far less than one tick of compute).

A first-time prefill runs on its own B=1 copy of the model tree (same weight tensors, separate
streaming state) in a dedicated worker thread. That never touches the live batch, so live
calls' ticks are never stalled waiting for it; the cost is that the prefill competes for the
device with the ticker for those ~T+12+len(persona) steps instead of being interleaved. The
alternative (a few prefill frames per tick inside the ticker's batch) would put prefill work on
the critical path of every tick, and would make the ticker's latency depend on how many new
personas are being opened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_graph import GraphedLMStep
from agent.plugins.personaplex.lm_stepper import NOT_FORCED, LMStepper
from agent.plugins.personaplex.policy import wrap_persona
from agent.plugins.personaplex.stepper import GREEDY

if TYPE_CHECKING:
    from sentencepiece import SentencePieceProcessor

SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
SILENCE_FRAMES = 6
DEFAULT_SNAPSHOT_CAPACITY = 32

ModuleT = TypeVar("ModuleT", bound=nn.Module)


@dataclass(frozen=True)
class VoicePrompt:
    embeddings: torch.Tensor  # [T, 1, 1, dim]
    cache: torch.Tensor  # [1, K, C] token cache after the voice prompt

    @property
    def frames(self) -> int:
        return int(self.embeddings.shape[0])


@dataclass(frozen=True)
class PromptPlan:
    """What to prefill: an optional voice prompt (stored embeddings, or the Mimi codes of a
    voice recording, [T, agent codebooks]) and the persona's text tokens."""

    voice: VoicePrompt | None
    text_tokens: tuple[int, ...]
    silence_frames: int = SILENCE_FRAMES
    voice_codes: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.voice is not None and self.voice_codes is not None:
            raise ValueError("a prompt has one voice: stored embeddings or audio codes")

    @property
    def frames(self) -> int:
        """Prefill steps = T + 2 * silence + len(persona tokens), one fewer unless the voice is
        replayed from embeddings (the reference's discarded first call; see `run_prefill`)."""
        voice = self.voice.frames if self.voice is not None else 0
        audio = int(self.voice_codes.shape[0]) if self.voice_codes is not None else 0
        return (
            voice + audio + 2 * self.silence_frames + len(self.text_tokens) - (self.voice is None)
        )


def persona_tokens(tokenizer: SentencePieceProcessor, persona: str) -> tuple[int, ...]:
    """SentencePiece ids of the wrapped persona."""
    return tuple(int(t) for t in tokenizer.encode(wrap_persona(persona)))


def check_voice_prompt(voice: VoicePrompt, lm: LMModel, name: str) -> None:
    """A voice file must fit this model: refuse it with a clear message otherwise."""
    emb, cache = voice.embeddings, voice.cache
    if emb.dim() != 4 or emb.shape[1:3] != (1, 1) or emb.shape[-1] != lm.dim:
        raise ValueError(
            f"voice {name}: embeddings must be [T, 1, 1, {lm.dim}], got {list(emb.shape)}"
        )
    if cache.dim() != 3 or cache.shape[0] != 1 or cache.shape[1] != lm.num_codebooks:
        raise ValueError(
            f"voice {name}: cache must be [1, {lm.num_codebooks}, C], got {list(cache.shape)}"
        )


def _row(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.long, device=device)


@torch.no_grad()
def run_prefill(stepper: LMStepper, slot: int, plan: PromptPlan,
                step: Callable[..., object] | None = None) -> None:
    """Step `slot` of `stepper` (every other slot frozen) through the prompt. `step` replaces
    `stepper.step` (same signature), e.g. a CUDA-graphed step of the same stepper.

    The column layout is NVIDIA's `LMGen` one, checked frame for frame against it
    (tests/personaplex/test_golden_parity.py). Its call at offset o writes that call's user
    codes, forced text and forced agent codes into column o (+ each row's delay) and predicts
    column o from column o - 1; its first call (offset 0) only lays initial tokens. Our step s
    predicts column s + 1 from column s and writes forced tokens at s + 1, so our step s is its
    call s + 1, provided user codes also go one column later (`lag_user_codes`, kept for the
    rest of the call). Hence:
    - with a voice prompt, its discarded first call carried dummy tokens, and the replay and
      every prompt frame map one to one onto our steps;
    - otherwise the discarded call is the prompt's first frame (the voice recording's first
      frame of codes, or the first silence frame), which never reaches the model: we start at
      the second.
    A caller's frame f then lands in the column right after the prompt's last frame, as there.
    """
    step = step or stepper.step
    lm = stepper.lm
    device = lm.device
    assert stepper.state is not None
    batch = stepper.state["offset"].shape[0]
    active = torch.zeros(batch, dtype=torch.bool, device=device)
    active[slot] = True
    n_user, n_agent = lm.num_user_codebooks, lm.num_agent_codebooks
    stepper.lag_user_codes(slot)

    def spread(row: torch.Tensor, fill: int) -> torch.Tensor:
        full = torch.full((batch, row.shape[-1]), fill, dtype=torch.long, device=device)
        full[slot] = row[0]
        return full

    sine = spread(_row(SINE_TOKENS[:n_user], device), lm.initial_token_id)
    silence = spread(_row(SILENCE_TOKENS[:n_agent], device), NOT_FORCED)
    pad = torch.full((batch,), NOT_FORCED, dtype=torch.long, device=device)
    pad[slot] = lm.text_padding_token_id

    if plan.voice is not None:
        # While replaying, the token rows hold "nothing yet" values; the restored cache
        # replaces them afterwards (as the reference voice prompt files were made).
        initial_user = torch.full(
            (batch, n_user), lm.initial_token_id, dtype=torch.long, device=device
        )
        initial_agent = spread(
            torch.full((1, n_agent), lm.initial_token_id, dtype=torch.long, device=device),
            NOT_FORCED,
        )
        embeddings = plan.voice.embeddings.to(device=device, dtype=lm.dtype)
        mask = active.clone()
        for index in range(plan.voice.frames):
            given = torch.zeros(batch, embeddings.shape[-1], dtype=lm.dtype, device=device)
            given[slot] = embeddings[index].reshape(-1)
            step(initial_user, forced_text=pad, forced_agent=initial_agent,
                 input_embeddings=given, embeddings_mask=mask, active=active)
        stepper.restore_token_cache(slot, plan.voice.cache[0])

    frames: list[tuple[torch.Tensor, torch.Tensor]] = []  # (forced text, forced agent codes)
    if plan.voice_codes is not None:
        codes = plan.voice_codes.to(device=device, dtype=torch.long)
        frames += [(pad, spread(codes[index : index + 1, :n_agent], NOT_FORCED))
                   for index in range(codes.shape[0])]
    frames += [(pad, silence)] * plan.silence_frames
    for token in plan.text_tokens:
        text = torch.full((batch,), NOT_FORCED, dtype=torch.long, device=device)
        text[slot] = token
        frames.append((text, silence))
    frames += [(pad, silence)] * plan.silence_frames
    if plan.voice is None:
        frames = frames[1:]  # the reference's discarded first call
    for text, agent in frames:
        step(sine, forced_text=text, forced_agent=agent, active=active)


def detached_copy(model: ModuleT) -> ModuleT:
    """A structural copy of `model` that shares every weight tensor but has its own streaming
    state, so a second thread can stream through it without touching the original's state.
    Make it before another thread streams through `model` (its state is set aside meanwhile)."""
    memo: dict[int, object] = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        memo[id(tensor)] = tensor
    saved = {name: module.state for name, module in streaming.streaming_modules(model)}
    for _, module in streaming.streaming_modules(model):
        module.state = None
    try:
        clone = copy.deepcopy(model, memo)
    finally:
        for name, module in streaming.streaming_modules(model):
            module.state = saved[name]
    return clone


PromptKey = tuple[str | None, str | None]


class PromptCache:
    """Prompt snapshots by (voice, persona), each computed once on a dedicated thread.

    `get` (event loop) awaits a snapshot, starting its prefill if needed; `ready` (any thread)
    returns one already made. Concurrent requests for the same key share one prefill.
    """

    def __init__(
        self,
        lm: LMModel,
        plan_for: Callable[[str | None, str | None], PromptPlan],
        capacity: int = DEFAULT_SNAPSHOT_CAPACITY,
    ) -> None:
        self._plan_for = plan_for
        self._lm = detached_copy(lm)
        self._stepper = LMStepper(self._lm, 1, GREEDY)
        self._step = GraphedLMStep(self._stepper)  # a CUDA graph on GPUs, eager elsewhere
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="prefill"
        )
        self._lock = threading.Lock()
        self._snapshots: OrderedDict[PromptKey, streaming.SlotSnapshot] = OrderedDict()
        self._pending: dict[PromptKey, concurrent.futures.Future[streaming.SlotSnapshot]] = {}
        self._capacity = capacity
        self.prefills_run = 0
        # On a GPU the prefill gets its own stream, so its kernels overlap the ticker's
        # instead of queueing in front of them.
        self._stream = torch.cuda.Stream(lm.device) if lm.device.type == "cuda" else None

    def ready(self, key: PromptKey) -> streaming.SlotSnapshot | None:
        with self._lock:
            snapshot = self._snapshots.get(key)
            if snapshot is not None:
                self._snapshots.move_to_end(key)
            return snapshot

    def submit(self, key: PromptKey) -> concurrent.futures.Future[streaming.SlotSnapshot]:
        with self._lock:
            snapshot = self._snapshots.get(key)
            if snapshot is not None:
                done: concurrent.futures.Future[streaming.SlotSnapshot] = (
                    concurrent.futures.Future()
                )
                done.set_result(snapshot)
                return done
            pending = self._pending.get(key)
            if pending is None:
                pending = self._executor.submit(self._prefill, key)
                self._pending[key] = pending
            return pending

    async def get(self, key: PromptKey) -> streaming.SlotSnapshot:
        return await asyncio.wrap_future(self.submit(key))

    def get_blocking(self, key: PromptKey) -> streaming.SlotSnapshot:
        return self.submit(key).result()

    def _prefill(self, key: PromptKey) -> streaming.SlotSnapshot:
        try:
            plan = self._plan_for(*key)
            mask = torch.ones(1, dtype=torch.bool, device=self._lm.device)
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    self._stepper.reset_slots(mask)
                    run_prefill(self._stepper, 0, plan, self._step.step)
                    snapshot = self._stepper.export_slot(0)
                self._stream.synchronize()
            else:
                self._stepper.reset_slots(mask)
                run_prefill(self._stepper, 0, plan, self._step.step)
                snapshot = self._stepper.export_slot(0)
            with self._lock:
                self._snapshots[key] = snapshot
                self.prefills_run += 1
                while len(self._snapshots) > self._capacity:
                    self._snapshots.popitem(last=False)
            return snapshot
        finally:
            with self._lock:
                self._pending.pop(key, None)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
