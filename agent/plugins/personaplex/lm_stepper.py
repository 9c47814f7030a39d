"""Batched per-frame token step of the LM, with the delay pattern.

Each slot owns a small ring of token columns (`tokens` [B, K, CT]); column c holds text, agent
and user tokens of model step c, where row k carries the codebook of audio frame c - delay[k].
One call to `step` advances every active slot by one frame:

1. the user's Mimi codes of this frame go into their rows at column s + delay;
2. column s (initial tokens where a row has no value yet) is embedded and run through the
   temporal transformer (or caller-supplied embeddings replace it, for voice prompts);
3. the text token and then the agent codebooks (depformer) are chosen, unless forced, and
   written to column s + 1;
4. the agent frame whose codebooks are now all known is returned de-delayed.

This reproduces the reference `LMGen.step` for the Moshi layout. For PersonaPlex (dep_q 16)
only the agent codebooks are generated; the user's rows always come from the microphone.
Forced tokens follow PersonaPlex's prompting: a forced text token is this step's text; a
forced agent frame is placed with the delays and teacher-forces the depformer.

Relation to PersonaPlex's own `LMGen`: its call n does our step n - 1 (its first call only
fills initial tokens), and it writes the user frame given at call n into column n, where we
write the frame given at step s into column s. Both put user frame f in column f and predict
agent column f + 1 from columns <= f; we just run that prediction as soon as frame f arrives,
one frame earlier. Its prompt inputs (text at the target column, agent frames with delays,
voice embeddings then a restored token cache) map onto `forced_text`, `forced_agent`,
`input_embeddings` and `restore_token_cache`.

All slot state lives in `self.state` (StreamingModule), so `reset_slots`, `export_slot` and
`import_slot` from `streaming.py` cover the token ring and every KV cache at once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from agent.plugins.personaplex import streaming
from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.sampling import SamplingConfig, choose_tokens

NOT_FORCED = -1
UNGENERATED = -2


@dataclass
class LMStepOutput:
    text_tokens: torch.Tensor  # [B] text token chosen this step (immediately usable)
    audio_codes: torch.Tensor  # [B, n_agent] de-delayed agent frame; UNGENERATED where not valid
    audio_valid: torch.Tensor  # [B] bool: False before a slot's first complete frame (or frozen)
    aligned_text: torch.Tensor  # [B] text token aligned with `audio_codes` (reference LMGen row 0)


class LMStepper(streaming.StreamingModule):
    """Steps B slots of an `LMModel` one frame at a time."""

    def __init__(
        self, lm: LMModel, batch_size: int, sampling: SamplingConfig | None = None
    ) -> None:
        super().__init__()
        self.lm = lm
        self.batch_size = batch_size
        self.sampling = sampling or SamplingConfig()
        self.n_agent = lm.num_agent_codebooks
        self.n_user = lm.num_user_codebooks
        self.max_delay = max(lm.delays)
        # Columns s .. s + 1 + max_delay are live during a step (forced agent codes look ahead).
        self.ring = self.max_delay + 3
        device = lm.device
        self.delays = torch.tensor(lm.delays, dtype=torch.long, device=device)
        self.initial = lm.initial_tokens()
        self.agent_rows = torch.arange(1, 1 + self.n_agent, device=device)
        self.user_rows = torch.arange(1 + self.n_agent, 1 + lm.n_q, device=device)
        self.output_rows = torch.arange(0, 1 + self.n_agent, device=device)
        # The LM's streaming state lives in its modules: one stepper drives an LM at a time.
        object.__setattr__(lm, "_driving_stepper", weakref.ref(self))
        streaming.start_streaming(self, batch_size)

    def init_state(self, batch_size: int) -> dict[str, torch.Tensor]:
        device = self.lm.device
        shape = (batch_size, self.lm.num_codebooks, self.ring)
        return {
            "tokens": torch.full(shape, UNGENERATED, dtype=torch.long, device=device),
            "provided": torch.zeros(shape, dtype=torch.bool, device=device),
            "offset": torch.zeros(batch_size, dtype=torch.long, device=device),
            # 1 after a prompt: user codes go one column later (see `prompt.run_prefill`).
            "user_lag": torch.zeros(batch_size, dtype=torch.long, device=device),
            "seed": torch.zeros(batch_size, dtype=torch.long, device=device),
        }

    # ------------------------------------------------------------------ slot management

    def reset_slots(self, mask: torch.Tensor, seeds: torch.Tensor | None = None) -> None:
        """Fresh state for the masked slots (a new call); optional sampling seeds for them."""
        streaming.reset_slots(self, mask)
        if seeds is not None:
            assert self.state is not None
            seed = self.state["seed"]
            seed.copy_(torch.where(mask.to(seed.device), seeds.to(seed.device), seed))

    def export_slot(self, slot: int) -> streaming.SlotSnapshot:
        return streaming.export_slot(self, slot)

    def import_slot(self, slot: int, snapshot: streaming.SlotSnapshot) -> None:
        streaming.import_slot(self, slot, snapshot)

    def lag_user_codes(self, slot: int) -> None:
        """From now on, write this slot's user codes one column later: the column layout
        NVIDIA's LMGen has after a system prompt (see `prompt.run_prefill`)."""
        assert self.state is not None
        self.state["user_lag"][slot] = 1

    def restore_token_cache(self, slot: int, cache: torch.Tensor) -> None:
        """Overwrite a slot's token columns from a saved cache [K, CT_saved] indexed by
        column % CT_saved (as in PersonaPlex voice prompt files), for the columns this slot
        reads or writes next. Provided flags are left as they are."""
        assert self.state is not None
        cache = cache.to(self.lm.device, torch.long)
        offset = self.state["offset"][slot]
        columns = offset + torch.arange(self.ring, device=cache.device)
        self.state["tokens"][slot][:, columns % self.ring] = cache[:, columns % cache.shape[-1]]

    # ------------------------------------------------------------------ the step

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
        """Advance every active slot by one frame.

        user_codes [B, >= n_user]: this frame's user Mimi codes (extra codebooks are ignored;
            may be None only if n_user == 0).
        forced_text [B]: text token to use instead of the model's (NOT_FORCED = -1: choose).
        forced_agent [B, n_agent]: agent frame to place (with delays) instead of generating
            (-1 entries are not forced). Used for silence frames while prompting.
        input_embeddings [B, dim] with embeddings_mask [B]: replace the token embedding of the
            masked slots (voice prompt replay).
        active [B] bool: slots not active are left exactly as they were.
        """
        state = self.state
        assert state is not None, "stepper is not streaming"
        lm = self.lm
        owner = getattr(lm, "_driving_stepper", None)
        if owner is None or owner() is not self:
            raise RuntimeError(
                "another LMStepper was created on this LMModel and owns its streaming state"
            )
        tokens, provided, offset = state["tokens"], state["provided"], state["offset"]
        batch = tokens.shape[0]
        device = tokens.device
        ring = self.ring
        live = (
            torch.ones(batch, dtype=torch.bool, device=device)
            if active is None
            else active.to(device)
        )
        slots = torch.arange(batch, device=device)[:, None]

        if self.n_user:
            if user_codes is None:
                raise ValueError("user_codes are required for this model")
            if (
                user_codes.dim() != 2
                or user_codes.shape[0] != batch
                or user_codes.shape[1] < self.n_user
            ):
                raise ValueError(
                    f"user_codes must be [{batch}, >={self.n_user}], got {list(user_codes.shape)}"
                )
            user_codes = user_codes[:, : self.n_user]  # a codec may produce more codebooks
            lag = state["user_lag"][:, None]
            columns = (offset[:, None] + lag + self.delays[self.user_rows][None]) % ring
            self._write(
                slots, self.user_rows[None], columns, user_codes.to(device), live[:, None], True
            )

        target = (offset + 1) % ring
        if forced_text is not None:
            forced_text = forced_text.to(device)
            self._write(
                slots[:, 0],
                0,
                (offset + 1 + self.delays[0]) % ring,
                forced_text,
                live & (forced_text >= 0),
                True,
            )
        if forced_agent is not None:
            forced_agent = forced_agent.to(device)
            columns = (offset[:, None] + 1 + self.delays[self.agent_rows][None]) % ring
            mask = live[:, None] & (forced_agent >= 0)
            self._write(slots, self.agent_rows[None], columns, forced_agent, mask, True)

        current = tokens.gather(2, (offset % ring)[:, None, None].expand(-1, tokens.shape[1], 1))[
            :, :, 0
        ]
        use_initial = (offset[:, None] <= self.delays[None]) | ~live[:, None]
        current = torch.where(use_initial, self.initial[None], current)

        embeddings = lm.embed_codes(current)
        if input_embeddings is not None:
            if embeddings_mask is None:
                raise ValueError("embeddings_mask is required with input_embeddings")
            given = input_embeddings.to(device=device, dtype=embeddings.dtype).view(batch, 1, -1)
            embeddings = torch.where(embeddings_mask.to(device)[:, None, None], given, embeddings)
        transformer_out, text_logits = lm.forward_embeddings(embeddings, active=active)

        config = self.sampling
        seed = state["seed"]
        target_column = target[:, None, None].expand(-1, tokens.shape[1], 1)
        target_tokens = tokens.gather(2, target_column)[:, :, 0]
        target_provided = provided.gather(2, target_column)[:, :, 0]
        text = choose_tokens(
            text_logits.float(),
            config.use_sampling,
            config.temp_text,
            config.top_k_text,
            seed,
            offset,
            0,
        )
        text = torch.where(target_provided[:, 0], target_tokens[:, 0], text)

        prev = text
        agent = []
        for index in range(self.n_agent):
            logits = lm.depformer_logits(index, prev, transformer_out)
            token = choose_tokens(
                logits.float(),
                config.use_sampling,
                config.temp,
                config.top_k,
                seed,
                offset,
                1 + index,
            )
            prev = torch.where(target_provided[:, 1 + index], target_tokens[:, 1 + index], token)
            agent.append(prev)
        generated = torch.stack([text, *agent], dim=1)  # [B, 1 + n_agent]

        self._write(
            slots,
            self.output_rows[None],
            target[:, None].expand(-1, 1 + self.n_agent),
            generated,
            live[:, None],
            False,
        )
        # Column s is consumed: its provided flags must not leak into column s + ring.
        consumed = (offset % ring)[:, None, None].expand(-1, tokens.shape[1], 1)
        provided.scatter_(2, consumed, provided.gather(2, consumed) & ~live[:, None, None])
        offset.add_(live.to(offset.dtype))

        out_columns = (
            offset[:, None] - self.max_delay + self.delays[self.output_rows][None]
        ) % ring
        frame = tokens[slots, self.output_rows[None], out_columns]
        valid = live & (offset > self.max_delay)
        frame = torch.where(valid[:, None], frame, UNGENERATED)
        return LMStepOutput(
            text_tokens=text,
            audio_codes=frame[:, 1:],
            audio_valid=valid,
            aligned_text=frame[:, 0],
        )

    def _write(
        self,
        slots: torch.Tensor,
        rows: torch.Tensor | int,
        columns: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        mark_provided: bool,
    ) -> None:
        """tokens[slot, row, column] = value where mask (broadcast together)."""
        assert self.state is not None
        tokens, provided = self.state["tokens"], self.state["provided"]
        old = tokens[slots, rows, columns]
        tokens[slots, rows, columns] = torch.where(mask, values, old)
        if mark_provided:
            provided[slots, rows, columns] = provided[slots, rows, columns] | mask
