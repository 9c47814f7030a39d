"""LMStepper behaviour on its own: slots joining late, frozen slots, forcing, snapshots."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from agent.plugins.personaplex.lm import LMModel
from agent.plugins.personaplex.lm_stepper import UNGENERATED, LMStepOutput, LMStepper
from agent.plugins.personaplex.sampling import SamplingConfig

from .helpers import TINY_LM_KWARGS

pytestmark = pytest.mark.model

CONFIG: dict[str, Any] = TINY_LM_KWARGS


@pytest.fixture(scope="module")
def lm() -> LMModel:
    torch.manual_seed(0)
    model = LMModel(**CONFIG).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(2.0)  # sharper logits: fewer near-ties, more varied tokens
    return model


def _codes(seed: int, batch: int, frames: int) -> torch.Tensor:
    return torch.randint(
        0, CONFIG["card"], (batch, 8, frames), generator=torch.Generator().manual_seed(seed)
    )


def _record(out: LMStepOutput, slot: int) -> tuple[int, bool, tuple[int, ...], int]:
    return (
        int(out.text_tokens[slot]),
        bool(out.audio_valid[slot]),
        tuple(out.audio_codes[slot].tolist()),
        int(out.aligned_text[slot]),
    )


def _alone(
    lm: LMModel, codes: torch.Tensor, frames: int, sampling: SamplingConfig | None, seed: int
) -> list:
    stepper = LMStepper(lm, 1, sampling)
    stepper.reset_slots(torch.tensor([True]), seeds=torch.tensor([seed]))
    return [_record(stepper.step(codes[None, :, t]), 0) for t in range(frames)]


@pytest.mark.parametrize(
    "sampling", [None, SamplingConfig(use_sampling=True)], ids=["greedy", "sampled"]
)
def test_slots_joining_at_different_frames_match_running_alone(
    lm: LMModel, sampling: SamplingConfig | None
) -> None:
    starts = [0, 3, 9, 14]
    frames = 24
    codes = _codes(1, 4, frames)
    garbage = _codes(2, 4, 40)
    seeds = [11, 22, 33, 44]
    alone = [_alone(lm, codes[slot], frames, sampling, seeds[slot]) for slot in range(4)]

    stepper = LMStepper(lm, 4, sampling)
    batched: list[list] = [[] for _ in starts]
    for tick in range(max(starts) + frames):
        joining = torch.tensor([tick == start for start in starts])
        if joining.any():
            stepper.reset_slots(joining, seeds=torch.tensor(seeds))
        user = torch.stack(
            [
                codes[slot, :, tick - start]
                if start <= tick < start + frames
                else garbage[slot, :, tick % 40]
                for slot, start in enumerate(starts)
            ]
        )
        out = stepper.step(user)
        for slot, start in enumerate(starts):
            if start <= tick < start + frames:
                batched[slot].append(_record(out, slot))
    for slot in range(4):
        assert batched[slot] == alone[slot], f"slot {slot}"
    texts = {record[0] for records in alone for record in records}
    audio = {code for records in alone for record in records for code in record[2]}
    assert len(texts) > 3 and len(audio) > 10  # the model is not stuck on one token


def test_frozen_slot_continues_as_if_paused(lm: LMModel) -> None:
    frames = 20
    codes = _codes(3, 2, frames)
    alone = _alone(lm, codes[1], frames, None, 0)
    stepper = LMStepper(lm, 2)
    got = []
    local = 0
    for tick in range(40):
        if local == frames:
            break
        active = torch.tensor([True, tick % 3 != 2])
        out = stepper.step(
            torch.stack([codes[0, :, tick % frames], codes[1, :, local]]), active=active
        )
        if active[1]:
            got.append(_record(out, 1))
            local += 1
        else:
            assert not bool(out.audio_valid[1])
    assert got == alone


def test_forced_text_and_agent_frames(lm: LMModel) -> None:
    """A forced text token is this step's text; a forced agent frame comes out de-delayed
    on the next step (PersonaPlex's silence-frame prompting)."""
    stepper = LMStepper(lm, 2)
    codes = _codes(4, 2, 12)
    silence = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]] * 2)
    not_forced = torch.full((2,), -1)
    outs = []
    for t in range(12):
        forced_text = torch.tensor([3, -1]) if t < 6 else not_forced
        forced_agent = torch.stack([silence[0], torch.full((8,), -1)]) if t < 6 else None
        outs.append(
            stepper.step(codes[:, :, t], forced_text=forced_text, forced_agent=forced_agent)
        )
    assert not bool(outs[0].audio_valid.any())
    for t in range(6):
        assert int(outs[t].text_tokens[0]) == 3
    for t in range(1, 7):
        assert outs[t].audio_codes[0].tolist() == silence[0].tolist()
        assert int(outs[t].aligned_text[0]) == 3
    # The unforced slot generated its own tokens.
    assert any(outs[t].audio_codes[1].tolist() != silence[0].tolist() for t in range(1, 7))
    assert outs[0].audio_codes[0].tolist() == [UNGENERATED] * 8


def _run(
    lm: LMModel, batch: int, inputs: list[dict[str, Any]]
) -> tuple[list[LMStepOutput], LMStepper]:
    stepper = LMStepper(lm, batch)
    return [stepper.step(**kwargs) for kwargs in inputs], stepper


def test_input_embeddings_replace_only_masked_slots(lm: LMModel) -> None:
    codes = _codes(5, 2, 6)
    embeddings = torch.randn(2, CONFIG["dim"], generator=torch.Generator().manual_seed(6)) * 3
    plain, plain_stepper = _run(lm, 2, [{"user_codes": codes[:, :, t]} for t in range(6)])
    plain_tokens = plain_stepper.state["tokens"].clone()
    replaced, replaced_stepper = _run(
        lm,
        2,
        [
            {
                "user_codes": codes[:, :, t],
                "input_embeddings": embeddings,
                "embeddings_mask": torch.tensor([False, t < 3]),
            }
            for t in range(6)
        ],
    )
    for a, b in zip(plain, replaced, strict=True):
        assert _record(a, 0) == _record(b, 0)
    assert not torch.equal(plain_tokens[1], replaced_stepper.state["tokens"][1])


def test_snapshot_of_a_slot_continues_identically(lm: LMModel) -> None:
    codes = _codes(7, 1, 20)
    other_lm = copy.deepcopy(lm)
    source = LMStepper(lm, 2)
    for t in range(10):
        source.step(torch.cat([codes[:, :, t], codes[:, :, t]]))
    snapshot = source.export_slot(0)
    target = LMStepper(other_lm, 3)
    for t in range(4):
        target.step(_codes(8, 3, 4)[:, :, t])
    target.import_slot(2, snapshot)
    for t in range(10, 20):
        a = source.step(torch.cat([codes[:, :, t], codes[:, :, t]]))
        b = target.step(torch.cat([_codes(9, 2, 1)[:, :, 0], codes[:, :, t]]))
        assert _record(a, 0) == _record(b, 2)


def test_second_stepper_on_the_same_lm_is_refused(lm: LMModel) -> None:
    first = LMStepper(lm, 1)
    LMStepper(lm, 2)
    with pytest.raises(RuntimeError, match="another LMStepper"):
        first.step(_codes(0, 1, 1)[:, :, 0])


def test_restore_token_cache_maps_columns(lm: LMModel) -> None:
    stepper = LMStepper(lm, 2)
    for t in range(5):
        stepper.step(_codes(10, 2, 5)[:, :, t])
    saved = torch.arange(17 * 4).view(17, 4)  # PersonaPlex files hold 4 columns
    stepper.restore_token_cache(1, saved)
    offset = int(stepper.state["offset"][1])
    ring = stepper.ring
    for column in range(offset, offset + ring):
        assert (
            stepper.state["tokens"][1, :, column % ring].tolist() == saved[:, column % 4].tolist()
        )
    assert (stepper.state["tokens"][0] != saved[:, :1]).any()


def test_missing_or_misshaped_user_codes_are_errors(lm: LMModel) -> None:
    stepper = LMStepper(lm, 2)
    with pytest.raises(ValueError, match="user_codes"):
        stepper.step(None)
    with pytest.raises(ValueError, match="user_codes"):
        stepper.step(torch.zeros(2, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="user_codes"):
        stepper.step(torch.zeros(3, 8, dtype=torch.long))


def test_extra_codec_codebooks_are_ignored(lm: LMModel) -> None:
    codes = _codes(12, 2, 5)
    extra = torch.randint(0, CONFIG["card"], (2, 4, 5), generator=torch.Generator().manual_seed(13))
    plain = [
        _record(out, 1)
        for out in _run(lm, 2, [{"user_codes": codes[:, :, t]} for t in range(5)])[0]
    ]
    wide = _run(
        lm, 2, [{"user_codes": torch.cat([codes[:, :, t], extra[:, :, t]], 1)} for t in range(5)]
    )[0]
    assert plain == [_record(out, 1) for out in wide]


def test_bfloat16_compute_dtype_steps(lm: LMModel) -> None:
    """The serving dtype runs the same code path (on CPU here) and yields in-range tokens."""
    half = copy.deepcopy(lm).to(torch.bfloat16)
    stepper = LMStepper(half, 2)
    codes = _codes(11, 2, 6)
    for t in range(6):
        out = stepper.step(codes[:, :, t])
        assert ((out.text_tokens >= 0) & (out.text_tokens < CONFIG["text_card"])).all()
        if t > 0:
            assert out.audio_valid.all()
            assert ((out.audio_codes >= 0) & (out.audio_codes < CONFIG["card"])).all()
    assert half.transformer.layers[0].self_attn.state["keys"].dtype == torch.bfloat16
