"""Make the PersonaPlex golden fixtures from NVIDIA's reference LMGen (not run in CI).

    python scripts/make_personaplex_golden.py --reference /path/to/personaplex/moshi

`--reference` is the folder holding NVIDIA's `moshi` package (from the public
NVIDIA/personaplex repository, `moshi/moshi`); nothing of it is copied here. The script writes
the tiny checkpoint with our generator (deterministic for its seed), loads the same LM weights
into NVIDIA's `LMModel` (fused attention names, as its loader expects), runs its `LMGen` on
CPU in float32 with greedy decoding through the whole system prompt (voice prompt embeddings
and token cache, or a voice recording's Mimi codes; 6 silence frames, persona tokens, 6 silence
frames), then feeds seeded user
codes one frame at a time. Per caller frame it records the text id, the 8 agent codes and the
decision margins (top-1 minus top-2 logit), into tests/personaplex/fixtures/golden_prefill.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.plugins.personaplex import lm_config  # noqa: E402
from agent.plugins.personaplex.tiny_checkpoint import write_checkpoint  # noqa: E402

FIXTURE = REPO / "tests" / "personaplex" / "fixtures" / "golden_prefill.json"
SEED = 0
CALLER_FRAMES = 24
SILENCE_FRAMES = 6
CASES: dict[str, dict[str, Any]] = {
    "voice_pt_and_persona": {"voice": "NATF2.pt", "persona": "You are a tiny test agent.",
                             "user_seed": 11},
    "prewrapped_persona": {"voice": "NATF2.pt",
                           "persona": "<system> You are already wrapped. <system>",
                           "user_seed": 12},
    "persona_without_voice": {"voice": None, "persona": "Just a persona.", "user_seed": 13},
    # A voice recording (.wav): its frames of Mimi codes go through the reference's
    # voice-from-audio path. The codes are seeded here and handed to that path by a stand-in
    # for Mimi (our Mimi is checked against the reference Mimi by the parity tests).
    "voice_audio_codes_and_persona": {"voice": None, "voice_codes_seed": 21, "voice_frames": 9,
                                      "persona": "You speak with a recorded voice.",
                                      "user_seed": 14},
}


class CodesAsMimi:
    """Hands NVIDIA's `_encode_voice_prompt_frames` fixed codes, one frame per encode."""

    def __init__(self, codes: torch.Tensor) -> None:
        self.codes = codes  # [1, 8, T]
        self.index = 0

    def parameters(self) -> Any:
        yield torch.zeros(1)

    def encode(self, batch: torch.Tensor) -> torch.Tensor:
        assert batch.shape[-1] == 1920, batch.shape
        frame = self.codes[:, :, self.index : self.index + 1]
        self.index += 1
        return frame


def fused_state(path: Path) -> dict[str, torch.Tensor]:
    """Split attention names (if any) → NVIDIA's fused `in_proj_weight` / `out_proj.weight`;
    the generator already writes the fused release layout."""
    state = load_file(str(path))
    fused: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for key, value in state.items():
        match = re.match(r"(.*\.self_attn)\.(in_projs|out_projs)\.(\d+)\.weight$", key)
        if match is None:
            fused[key] = value
            continue
        target = match.group(1) + (".in_proj_weight" if match.group(2) == "in_projs"
                                   else ".out_proj.weight")
        parts.setdefault(target, {})[int(match.group(3))] = value
    for target, pieces in parts.items():
        fused[target] = torch.cat([pieces[i] for i in sorted(pieces)])
    return fused


def margin(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float().reshape(-1), 2).values
    return round(float(top[0] - top[1]), 6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", required=True,
                        help="folder containing NVIDIA's `moshi` package")
    parser.add_argument("--out", default=str(FIXTURE))
    args = parser.parse_args()
    sys.path.insert(0, args.reference)
    from moshi.models import lm as nv_lm  # NVIDIA's, from --reference

    assert "personaplex" in nv_lm.__file__ or args.reference in nv_lm.__file__, nv_lm.__file__
    import sentencepiece

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_checkpoint(Path(scratch) / "tiny", "tiny", "personaplex", seed=SEED)
        weights = checkpoint / "model.safetensors"
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()
        info = lm_config.load_checkpoint_info(checkpoint)
        kwargs = lm_config.lm_constructor_kwargs(info)
        reference = nv_lm.LMModel(**kwargs, device="cpu", dtype=torch.float32).eval()
        missing, unexpected = reference.load_state_dict(fused_state(weights), strict=False)
        assert not unexpected, unexpected
        assert not missing, missing
        tokenizer = sentencepiece.SentencePieceProcessor(
            model_file=str(checkpoint / "tokenizer_spm_32k_3.model"))
        cases_out: dict[str, Any] = {}
        for name, case in CASES.items():
            persona = case["persona"]
            wrapped = persona if persona.startswith("<system>") and persona.endswith("<system>") \
                else f"<system> {persona.strip()} <system>"
            tokens = [int(t) for t in tokenizer.encode(wrapped)]
            gen = nv_lm.LMGen(reference, device="cpu", use_sampling=False,
                              audio_silence_frame_cnt=SILENCE_FRAMES, text_prompt_tokens=tokens,
                              return_logits=True, sample_rate=24000)
            if case["voice"] is not None:
                # The voice file is bf16 as released; the float32 reference model needs float32
                # (the values are the same: bf16 widens exactly).
                voice = torch.load(checkpoint / "voices" / case["voice"], map_location="cpu")
                widened = Path(scratch) / f"{name}.pt"
                torch.save({"embeddings": voice["embeddings"].float(), "cache": voice["cache"]},
                           widened)
                gen.load_voice_prompt_embeddings(str(widened))
            mimi: Any = None
            if "voice_codes_seed" in case:
                codes = torch.randint(0, kwargs["card"], (1, 8, case["voice_frames"]),
                                      generator=torch.Generator().manual_seed(
                                          case["voice_codes_seed"]))
                case = {**case, "voice_codes": codes[0].T.tolist()}  # [T, 8]
                gen.voice_prompt = "voice.wav"
                gen.voice_prompt_audio = np.zeros((1, 1920 * case["voice_frames"]),
                                                  dtype=np.float32)
                mimi = CodesAsMimi(codes)
            user = torch.randint(0, kwargs["card"], (1, 8, CALLER_FRAMES),
                                 generator=torch.Generator().manual_seed(case["user_seed"]))
            frames: list[dict[str, Any]] = []
            with torch.no_grad(), gen.streaming(1):
                gen.step_system_prompts(mimi=mimi)
                for index in range(CALLER_FRAMES):
                    out, logits = gen.step(input_tokens=user[:, :, index : index + 1])
                    if out is None:
                        frames.append({"frame": index, "out": None})
                        continue
                    text_logits, audio_logits = logits
                    frames.append({
                        "frame": index,
                        "text": int(out[0, 0, 0]),
                        "audio": [int(v) for v in out[0, 1:9, 0]],
                        "text_margin": margin(text_logits),
                        "audio_margins": [margin(audio_logits[0, k]) for k in range(8)],
                    })
            if mimi is not None:
                # Where the voice stage alone leaves the codes: the token cache after it.
                alone = nv_lm.LMGen(reference, device="cpu", use_sampling=False,
                                    audio_silence_frame_cnt=SILENCE_FRAMES, sample_rate=24000)
                alone.voice_prompt = gen.voice_prompt
                alone.voice_prompt_audio = gen.voice_prompt_audio
                with torch.no_grad(), alone.streaming(1):
                    alone._step_voice_prompt(CodesAsMimi(mimi.codes))
                    state = alone._streaming_state
                    case = {**case, "after_voice": {"offset": int(state.offset),
                                                    "cache": state.cache[0].tolist(),
                                                    "delays": list(reference.delays)}}
            cases_out[name] = {**case, "persona_tokens": tokens,
                               "user_codes": user[0].tolist(), "frames": frames}
    fixture = {
        "made_by": "scripts/make_personaplex_golden.py with NVIDIA/personaplex's moshi.models.lm",
        "checkpoint": {"size": "tiny", "layout": "personaplex", "seed": SEED,
                       "model_safetensors_sha256": digest},
        "silence_frames": SILENCE_FRAMES,
        "cases": cases_out,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.out}: " + ", ".join(
        f"{name} {sum(1 for f in c['frames'] if f.get('text') is not None)} frames"
        for name, c in cases_out.items()))


if __name__ == "__main__":
    main()
