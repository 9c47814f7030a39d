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


def run_ours(checkpoint: Path, case: dict[str, Any]) -> list[list[int]]:
    lm = lm_config.load_lm(lm_config.load_checkpoint_info(checkpoint), "cpu", torch.float32)
    tokenizer = sentencepiece.SentencePieceProcessor(
        model_file=str(checkpoint / "tokenizer_spm_32k_3.model"))
    tokens = persona_tokens(tokenizer, case["persona"])
    assert list(tokens) == case["persona_tokens"]
    voice = None
    if case["voice"] is not None:
        raw = torch.load(checkpoint / "voices" / case["voice"], map_location="cpu")
        voice = VoicePrompt(embeddings=raw["embeddings"], cache=raw["cache"])
    stepper = LMStepper(lm, 1)
    run_prefill(stepper, 0, PromptPlan(voice=voice, text_tokens=tokens,
                                       silence_frames=FIXTURE["silence_frames"]))
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
    expected = [[frame["text"], *frame["audio"]] for frame in case["frames"]]
    got = run_ours(checkpoint, case)
    mismatched = [index for index, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not mismatched, (
        f"{name}: {len(expected) - len(mismatched)}/{len(expected)} frames identical; first "
        f"difference at frame {mismatched[0]}: ours {got[mismatched[0]]} vs reference "
        f"{expected[mismatched[0]]}")
    # The comparison only means something if the model produces varied tokens.
    assert len({frame[0] for frame in expected}) > 3
    assert len({code for frame in expected for code in frame[1:]}) > 10
