"""Our prefill and stepper against NVIDIA's own PersonaPlex `LMGen` (golden fixtures).

NVIDIA's reference is not on a registry, so scripts/make_personaplex_golden.py ran it once on
the tiny checkpoint our generator writes (same seed, float32, greedy) and kept only its
outputs: per caller frame the text id and the 8 agent codes, after the whole system prompt.
Here the same checkpoint goes through our loader, `run_prefill` and `LMStepper`, and every
frame must be identical.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import sentencepiece
import torch

from agent.plugins.personaplex import lm_config
from agent.plugins.personaplex.lm_stepper import LMStepper
from agent.plugins.personaplex.prompt import PromptPlan, VoicePrompt, persona_tokens, run_prefill
from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint

pytestmark = pytest.mark.model

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "golden_prefill.json").read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = FIXTURE["checkpoint"]
    directory = write_checkpoint(tmp_path_factory.mktemp("golden") / "tiny", spec["size"],
                                 spec["layout"], seed=spec["seed"])
    digest = hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()
    assert digest == spec["model_safetensors_sha256"], (
        "the tiny checkpoint generator changed its weights: rerun "
        "scripts/make_personaplex_golden.py against NVIDIA's reference")
    return directory


def plan_for(checkpoint: Path, case: dict[str, Any]) -> PromptPlan:
    tokenizer = sentencepiece.SentencePieceProcessor(
        model_file=str(checkpoint / "tokenizer_spm_32k_3.model"))
    tokens = persona_tokens(tokenizer, case["persona"])
    assert list(tokens) == case["persona_tokens"]
    voice = None
    if case["voice"] is not None:
        raw = torch.load(checkpoint / "voices" / case["voice"], map_location="cpu")
        voice = VoicePrompt(embeddings=raw["embeddings"], cache=raw["cache"])
    codes = case.get("voice_codes")  # a voice recording's Mimi codes, [T, 8]
    return PromptPlan(voice=voice, text_tokens=tokens, silence_frames=FIXTURE["silence_frames"],
                      voice_codes=torch.tensor(codes) if codes is not None else None)


def expected_frames(case: dict[str, Any]) -> list[list[int]]:
    return [[frame["text"], *frame["audio"]] for frame in case["frames"]]


def row(out: Any, slot: int) -> list[int]:
    assert bool(out.audio_valid[slot])
    return [int(out.aligned_text[slot]), *(int(v) for v in out.audio_codes[slot])]


def run_ours(checkpoint: Path, case: dict[str, Any]) -> list[list[int]]:
    lm = lm_config.load_lm(lm_config.load_checkpoint_info(checkpoint), "cpu", torch.float32)
    stepper = LMStepper(lm, 1)
    run_prefill(stepper, 0, plan_for(checkpoint, case))
    user = torch.tensor(case["user_codes"], dtype=torch.long)[None]
    frames = []
    for index in range(user.shape[-1]):
        out = stepper.step(user[:, :, index])
        assert bool(out.audio_valid[0])
        frames.append([int(out.aligned_text[0]), *(int(v) for v in out.audio_codes[0])])
    return frames


@pytest.mark.parametrize("name", sorted(FIXTURE["cases"]))
def test_frames_identical_to_nvidia_reference(checkpoint: Path, name: str) -> None:
    case = FIXTURE["cases"][name]
    expected = expected_frames(case)
    got = run_ours(checkpoint, case)
    mismatched = [index for index, (e, g) in enumerate(zip(expected, got, strict=False)) if e != g]
    assert not mismatched, (
        f"{name}: {len(expected) - len(mismatched)}/{len(expected)} frames identical; first "
        f"difference at frame {mismatched[0]}: ours {got[mismatched[0]]} vs reference "
        f"{expected[mismatched[0]]}")
    # The comparison only means something if the model produces varied tokens.
    assert len({frame[0] for frame in expected}) > 3
    assert len({code for frame in expected for code in frame[1:]}) > 10


def test_a_call_joining_a_batch_midway_matches_the_reference_and_disturbs_nobody(
    checkpoint: Path,
) -> None:
    first, second = FIXTURE["cases"]["voice_pt_and_persona"], FIXTURE["cases"]["prewrapped_persona"]
    lm = lm_config.load_lm(lm_config.load_checkpoint_info(checkpoint), "cpu", torch.float32)
    stepper = LMStepper(lm, 2)
    only_first = torch.tensor([True, False])
    run_prefill(stepper, 0, plan_for(checkpoint, first))
    first_user = torch.tensor(first["user_codes"], dtype=torch.long)
    second_user = torch.tensor(second["user_codes"], dtype=torch.long)
    joined_at = 7
    got_first, got_second = [], []
    for index in range(joined_at):
        codes = torch.stack([first_user[:, index], torch.zeros(8, dtype=torch.long)])
        got_first.append(row(stepper.step(codes, active=only_first), 0))
    run_prefill(stepper, 1, plan_for(checkpoint, second))  # slot 0 frozen meanwhile
    for index in range(joined_at, len(first["frames"])):
        codes = torch.stack([first_user[:, index], second_user[:, index - joined_at]])
        out = stepper.step(codes)
        got_first.append(row(out, 0))
        got_second.append(row(out, 1))
    assert got_first == expected_frames(first)
    assert got_second == expected_frames(second)[: len(got_second)]


def test_a_voice_recordings_codes_land_where_the_reference_puts_them(checkpoint: Path) -> None:
    """The tiny model's greedy choices barely depend on agent codes, so the frames above would
    not notice codes in the wrong columns: compare the token cache after the voice stage."""
    case = FIXTURE["cases"]["voice_audio_codes_and_persona"]
    reference = case["after_voice"]
    codes = torch.tensor(case["voice_codes"])
    lm = lm_config.load_lm(lm_config.load_checkpoint_info(checkpoint), "cpu", torch.float32)
    stepper = LMStepper(lm, 1)
    run_prefill(stepper, 0, PromptPlan(voice=None, text_tokens=(), silence_frames=0,
                                       voice_codes=codes))
    assert stepper.state is not None
    ours = stepper.state["tokens"][0]
    ref_cache = torch.tensor(reference["cache"])
    delays = reference["delays"]
    assert list(lm.delays) == delays
    frames = codes.shape[0]
    for frame in range(frames - 2, frames):  # what the 4-column rings still hold
        for row in range(1, 9):
            column = frame + delays[row]
            expected = int(ref_cache[row, column % ref_cache.shape[-1]])
            assert expected == int(codes[frame, row - 1])
            assert int(ours[row, column % ours.shape[-1]]) == expected, (frame, row)
