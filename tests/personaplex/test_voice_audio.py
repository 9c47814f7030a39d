"""Voice prompts from recordings (.wav): read, resampled, -24 LUFS, Mimi-encoded, prefilled."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pyloudnorm
import pytest
import sphn
import torch

from agent.plugins.base import PluginError, PluginOptions, SessionConfig
from agent.plugins.personaplex import lm_config, mimi_config, streaming
from agent.plugins.personaplex.checkpoint import inspect_checkpoint
from agent.plugins.personaplex.lm_stepper import LMStepper
from agent.plugins.personaplex.plugin import PersonaPlexPlugin
from agent.plugins.personaplex.prompt import PromptPlan, run_prefill
from agent.plugins.personaplex.voice_audio import VoiceAudioError, encode_voice, read_voice_audio
from agent.plugins.registry import load_plugin

pytestmark = pytest.mark.model

RATE = 24000


def voice_recording(path: Path, seconds: float = 1.3, rate: int = 16000,
                    level: float = 0.02) -> Path:
    """A quiet, speech-like tone glide (not a whole number of Mimi frames long)."""
    t = np.arange(int(seconds * rate)) / rate
    audio = level * np.sin(2 * np.pi * (180 + 120 * t) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    sphn.write_wav(str(path), audio.astype(np.float32), rate)
    return path


def test_a_recording_is_resampled_and_normalised_to_minus_24_lufs(tmp_path: Path) -> None:
    audio = read_voice_audio(voice_recording(tmp_path / "quiet.wav"), RATE)
    # sphn's resampler (the reference's) works in chunks and leaves a short tail of padding.
    assert audio.dtype == np.float32 and 1.3 * RATE - 2 <= len(audio) < 1.3 * RATE + 2048
    assert pyloudnorm.Meter(RATE).integrated_loudness(audio.astype(np.float64)) == \
        pytest.approx(-24.0, abs=0.05)


def test_unusable_recordings_are_refused_with_the_reason(tmp_path: Path) -> None:
    silent = tmp_path / "silent.wav"
    sphn.write_wav(str(silent), np.zeros(RATE, np.float32), RATE)
    with pytest.raises(VoiceAudioError, match="silent"):
        read_voice_audio(silent, RATE)
    with pytest.raises(VoiceAudioError, match="limited to 1 s"):
        read_voice_audio(voice_recording(tmp_path / "long.wav", seconds=2.0), RATE, max_seconds=1)
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"RIFF not really a wave file")
    with pytest.raises(VoiceAudioError, match="cannot be read"):
        read_voice_audio(garbage, RATE)


def test_frame_by_frame_codes_equal_one_streaming_pass(tiny_checkpoint: Path,
                                                       tmp_path: Path) -> None:
    files = inspect_checkpoint(tiny_checkpoint, need_voices=False)
    info = lm_config.load_checkpoint_info(tiny_checkpoint)
    mimi = mimi_config.load_mimi(files.mimi_weights, info.mimi_config, "cpu", torch.float32, 8)
    audio = read_voice_audio(voice_recording(tmp_path / "v.wav"), RATE)
    codes = encode_voice(mimi, audio, 8)
    frames = -(-len(audio) // 1920)
    assert codes.shape == (frames, 8) and codes.dtype == torch.long
    padded = torch.zeros(1, 1, frames * 1920)
    padded[0, 0, : len(audio)] = torch.from_numpy(audio)
    streaming.start_streaming(mimi, 1)
    with torch.no_grad():  # four frames per call: streaming state must make this identical
        chunked = torch.cat([mimi.encode(padded[..., i: i + 4 * 1920])[0, :8].T
                             for i in range(0, padded.shape[-1], 4 * 1920)])
    streaming.stop_streaming(mimi)
    assert torch.equal(codes, chunked)
    assert len(set(codes.flatten().tolist())) > 8  # real codes, not one repeated value


@pytest.fixture
def checkpoint_with_recording(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, directory)
    voice_recording(directory / "voices" / "Custom_1.wav")
    return directory


def test_the_plugin_serves_a_recorded_voice(checkpoint_with_recording: Path) -> None:
    plugin = load_plugin("personaplex", PluginOptions(model_dir=str(checkpoint_with_recording),
                                                      max_sessions=1))
    assert isinstance(plugin, PersonaPlexPlugin)
    asyncio.run(plugin.start())
    try:
        caps = plugin.capabilities()
        assert "Custom_1.wav" in caps.voices
        kinds = dict(caps.voice_kinds)
        assert kinds["Custom_1.wav"] == "recording" and kinds["NATF2.pt"] == "embeddings"
        config = asyncio.run(plugin.prepare_runtime_config(
            SessionConfig(voice="Custom_1.wav", instructions="Hi.")))
        assert config.voice == "Custom_1.wav"
        model = plugin.model
        assert model is not None and model.prompts is not None
        snapshot = config.options["prompt_snapshot"]
        # The snapshot is the prefill of the recording's codes (encoded by our Mimi).
        info = lm_config.load_checkpoint_info(checkpoint_with_recording)
        mimi = mimi_config.load_mimi(model.files.mimi_weights, info.mimi_config, "cpu",
                                     torch.float32, 8)
        codes = encode_voice(mimi, read_voice_audio(
            checkpoint_with_recording / "voices" / "Custom_1.wav", RATE), 8)
        tokenizer = model.tokenizer
        from agent.plugins.personaplex.prompt import persona_tokens
        stepper = LMStepper(lm_config.load_lm(info, "cpu", torch.float32), 1)
        run_prefill(stepper, 0, PromptPlan(None, persona_tokens(tokenizer, "Hi."),
                                           voice_codes=codes))
        expected = stepper.export_slot(0)
        assert snapshot.keys() == expected.keys()
        assert all(torch.equal(snapshot[k], expected[k]) for k in expected)
        session = plugin.create_session(config)
        outputs = plugin.step([(session, np.zeros(1920, np.float32))])
        assert outputs[0].audio.shape == (1920,)
        plugin.close_session(session)
    finally:
        asyncio.run(plugin.close())


def test_an_uploaded_recording_is_prefilled_once_per_content(
        checkpoint_with_recording: Path, tmp_path: Path) -> None:
    plugin = load_plugin("personaplex", PluginOptions(model_dir=str(checkpoint_with_recording),
                                                      max_sessions=1))
    assert isinstance(plugin, PersonaPlexPlugin)
    asyncio.run(plugin.start())
    try:
        assert plugin.capabilities().voice_upload is True
        recording = (checkpoint_with_recording / "voices" / "Custom_1.wav").read_bytes()
        from_folder = asyncio.run(plugin.prepare_runtime_config(
            SessionConfig(voice="Custom_1.wav", instructions="Hi.")))
        uploaded = asyncio.run(plugin.prepare_runtime_config(
            SessionConfig(voice_audio=recording, instructions="Hi.")))
        assert uploaded.voice is not None and uploaded.voice.startswith("upload-")
        # The same recording gives the same prompt, whether bundled or uploaded.
        expected = from_folder.options["prompt_snapshot"]
        snapshot = uploaded.options["prompt_snapshot"]
        assert all(torch.equal(snapshot[k], expected[k]) for k in expected)
        model = plugin.model
        assert model is not None and model.prompts is not None
        prefills = model.prompts.prefills_run
        again = asyncio.run(plugin.prepare_runtime_config(
            SessionConfig(voice_audio=recording, instructions="Hi.")))
        assert again.voice == uploaded.voice and model.prompts.prefills_run == prefills
        other = voice_recording(tmp_path / "other.wav", seconds=0.9).read_bytes()
        different = asyncio.run(plugin.prepare_runtime_config(
            SessionConfig(voice_audio=other, instructions="Hi.")))
        assert different.voice != uploaded.voice and model.prompts.prefills_run == prefills + 1
        for bad, reason in ((b"RIFF not really a wave file", "cannot be read"),
                            (voice_recording(tmp_path / "long.wav", seconds=61.0).read_bytes(),
                             "limited to 60 s")):
            with pytest.raises(PluginError) as refused:
                asyncio.run(plugin.prepare_runtime_config(SessionConfig(voice_audio=bad)))
            assert refused.value.code == "invalid_voice_audio" and refused.value.status == 400
            assert reason in refused.value.message and refused.value.param == "voice_audio"
        assert plugin.uploads.get(uploaded.voice) is None  # bytes dropped once prefilled
    finally:
        asyncio.run(plugin.close())
