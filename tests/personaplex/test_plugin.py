"""The personaplex / moshi plugins through the base.Plugin contract, on tiny checkpoints."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agent.plugins.base import PluginError, PluginOptions, RuntimeConfig, SessionConfig
from agent.plugins.moshi_defaults import DEFAULT_PERSONA
from agent.plugins.personaplex.plugin import MoshiPlugin, PersonaPlexPlugin, text_piece
from agent.plugins.registry import load_plugin

from .helpers import speech_like_frames

pytestmark = pytest.mark.model


def _start(plugin: PersonaPlexPlugin) -> PersonaPlexPlugin:
    asyncio.run(plugin.start())
    return plugin


def _prepare(plugin: PersonaPlexPlugin, **kwargs: object) -> RuntimeConfig:
    return asyncio.run(plugin.prepare_runtime_config(SessionConfig(**kwargs)))  # type: ignore[arg-type]


def _code(fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(PluginError) as err:
        fn(*args, **kwargs)
    return err.value.code


@pytest.fixture(scope="module")
def plugin(tiny_checkpoint: Path) -> Iterator[PersonaPlexPlugin]:
    loaded = load_plugin(
        "personaplex", PluginOptions(model_dir=str(tiny_checkpoint), max_sessions=2)
    )
    assert isinstance(loaded, PersonaPlexPlugin)
    yield _start(loaded)
    asyncio.run(loaded.close())


def test_capabilities(plugin: PersonaPlexPlugin) -> None:
    caps = plugin.capabilities()
    assert (caps.sample_rate, caps.frame_size, caps.max_sessions) == (24000, 1920, 2)
    assert caps.emits_text and caps.default_voice == "NATF2.pt"
    assert "NATF2.pt" in caps.voices and "NATM1.pt" in caps.voices
    assert not caps.voice_update and not caps.instructions_update


def test_defaults_and_policy_errors(plugin: PersonaPlexPlugin) -> None:
    config = _prepare(plugin)
    assert config.voice == "NATF2.pt" and config.instructions == DEFAULT_PERSONA
    assert (
        _prepare(plugin, voice="NATM1.pt", instructions=" Be brief. ").instructions == "Be brief."
    )
    for bad in ("../NATF2.pt", "voices/NATF2.pt", "NOPE.pt", "NATF2"):
        assert _code(_prepare, plugin, voice=bad) == "invalid_voice"
    assert _code(_prepare, plugin, extra_body={"model_dir": "/etc"}) == "private_option"
    assert _code(_prepare, plugin, extra_body={"bogus": 1}) == "unknown_option"
    assert _code(_prepare, plugin, extra_body={"sampling": True, "top_k": 0}) == "invalid_option"


def test_voice_and_persona_are_fixed_after_open(plugin: PersonaPlexPlugin) -> None:
    current = _prepare(plugin, voice="NATM1.pt")
    update = plugin.runtime_config_for_update
    assert update(current, SessionConfig(voice="NATM1.pt")) is current
    assert update(current, SessionConfig(instructions=DEFAULT_PERSONA)) is current
    assert _code(update, current, SessionConfig(voice="NATF2.pt")) == "voice_update_unsupported"
    assert (
        _code(update, current, SessionConfig(instructions="New.")) == "persona_update_unsupported"
    )
    assert _code(update, current, SessionConfig(extra_body={"slot": 1})) == "private_option"


def test_sessions_step_restart_and_capacity(plugin: PersonaPlexPlugin) -> None:
    config = _prepare(plugin, voice="NATM1.pt")
    frames = speech_like_frames(seed=4, count=5)
    first = plugin.create_session(config)
    second = plugin.create_session(_prepare(plugin))
    assert _code(plugin.create_session, config) == "max_sessions_reached"
    outputs = [plugin.step([(first, f), (second, f)]) for f in frames]
    for pair in outputs:
        for out in pair:
            assert out.audio.dtype == np.float32 and out.audio.shape == (1920,)
            assert out.tokens is not None and len(out.tokens["audio"]) == 8
            assert out.text == text_piece(plugin._loaded().tokenizer, out.tokens["text"])
    tokens_first = [pair[0].tokens for pair in outputs]
    # A restart goes back to the post-prompt state: the same input gives the same output.
    plugin.restart_session(first)
    again = [plugin.step([(first, f), (second, f)])[0].tokens for f in frames]
    assert again == tokens_first
    plugin.close_session(second)
    third = plugin.create_session(config)  # the freed seat is usable again
    assert [plugin.step([(first, f), (third, f)])[1].tokens for f in frames] == tokens_first
    plugin.close_session(first)
    plugin.close_session(third)


def test_seeded_sampling_is_reproducible(plugin: PersonaPlexPlugin) -> None:
    frames = speech_like_frames(seed=5, count=6)

    def run(seed: int) -> list:
        config = _prepare(plugin, extra_body={"sampling": True, "seed": seed})
        session = plugin.create_session(config)
        try:
            return [plugin.step([(session, f)])[0].tokens for f in frames]
        finally:
            plugin.close_session(session)

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_text_pieces_hide_pads(plugin: PersonaPlexPlugin) -> None:
    tokenizer = plugin._loaded().tokenizer
    assert text_piece(tokenizer, 0) == "" and text_piece(tokenizer, 3) == ""
    assert text_piece(tokenizer, None) == "" and text_piece(tokenizer, 10**6) == ""
    word = next(
        i
        for i in range(4, tokenizer.get_piece_size())
        if tokenizer.id_to_piece(i).startswith("\u2581") and len(tokenizer.id_to_piece(i)) > 1
    )
    assert text_piece(tokenizer, word) == " " + tokenizer.id_to_piece(word)[1:]


def test_model_dir_errors(
    tmp_path: Path, tiny_checkpoint: Path, tiny_moshi_checkpoint: Path
) -> None:
    def start(model_dir: object, plugin_cls: type = PersonaPlexPlugin, **kwargs: object) -> None:
        _start(plugin_cls(str(model_dir) if model_dir else None, **kwargs))

    assert _code(start, None) == "model_dir_invalid"
    assert _code(start, tmp_path / "nowhere") == "model_dir_invalid"
    incomplete = tmp_path / "incomplete"
    shutil.copytree(tiny_checkpoint, incomplete)
    (incomplete / "tokenizer_spm_32k_3.model").unlink()
    assert _code(start, incomplete) == "model_dir_invalid"
    no_voices = tmp_path / "no_voices"
    shutil.copytree(tiny_checkpoint, no_voices)
    shutil.rmtree(no_voices / "voices")
    assert _code(start, no_voices) == "model_dir_invalid"
    corrupt = tmp_path / "corrupt"
    shutil.copytree(tiny_checkpoint, corrupt)
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert _code(start, corrupt) == "model_dir_invalid"
    assert _code(start, tiny_moshi_checkpoint) == "model_config_unsupported"
    assert _code(start, tiny_checkpoint, MoshiPlugin) == "model_config_unsupported"
    assert _code(start, tiny_checkpoint, voice="../x.pt") == "invalid_voice"
    assert _code(PersonaPlexPlugin, str(tiny_checkpoint), dtype="int8") == "invalid_dtype"
    assert _code(PersonaPlexPlugin, str(tiny_checkpoint), device="tpu") == "invalid_device"


def test_voices_archive(tmp_path: Path, tiny_checkpoint: Path) -> None:
    import tarfile

    packed = tmp_path / "packed"
    shutil.copytree(tiny_checkpoint, packed)
    with tarfile.open(packed / "voices.tgz", "w:gz") as tar:
        tar.add(packed / "voices", arcname="voices")
    shutil.rmtree(packed / "voices")
    plugin = _start(PersonaPlexPlugin(str(packed), voice="NATM1.pt"))
    try:
        assert "NATM1.pt" in plugin.capabilities().voices
        assert _prepare(plugin).voice == "NATM1.pt"
    finally:
        asyncio.run(plugin.close())


def test_moshi_plugin(tiny_moshi_checkpoint: Path) -> None:
    plugin = load_plugin("moshi", PluginOptions(model_dir=str(tiny_moshi_checkpoint)))
    assert isinstance(plugin, MoshiPlugin)
    _start(plugin)
    try:
        assert plugin.capabilities().voices == ()
        assert _code(_prepare, plugin, voice="NATF2.pt") == "invalid_voice"
        assert _code(_prepare, plugin, instructions="Be a pirate.") == "instructions_unsupported"
        config = _prepare(plugin)
        session = plugin.create_session(config)
        frames = speech_like_frames(seed=6, count=3)
        outputs = [plugin.step([(session, f)])[0] for f in frames]
        # Silence before the model's first output frame, then model audio.
        assert outputs[0].tokens["audio"] is None and not np.any(outputs[0].audio)
        assert outputs[1].tokens["audio"] is not None and np.any(outputs[1].audio)
        plugin.close_session(session)
    finally:
        asyncio.run(plugin.close())


def test_not_ready_before_start(tiny_checkpoint: Path) -> None:
    plugin = PersonaPlexPlugin(str(tiny_checkpoint))
    assert _code(_prepare, plugin) == "not_ready"


def test_sessions_keep_their_prompt_when_the_cache_evicts_it(tiny_checkpoint: Path) -> None:
    plugin = _start(PersonaPlexPlugin(str(tiny_checkpoint), max_sessions=2, prompt_cache_size=1))
    try:
        frames = speech_like_frames(seed=8, count=4)
        first = plugin.create_session(_prepare(plugin, instructions="First persona."))
        before = [plugin.step([(first, f)])[0].tokens for f in frames]
        second = plugin.create_session(_prepare(plugin, instructions="Second persona."))
        assert plugin._loaded().prompts.ready(("NATF2.pt", "First persona.")) is None  # evicted
        plugin.restart_session(first)
        after = [plugin.step([(first, f), (second, f)])[0].tokens for f in frames]
        assert after == before
    finally:
        asyncio.run(plugin.close())


def test_reference_preset_server_samples_repeatably_by_seed(tiny_checkpoint: Path) -> None:
    loaded = load_plugin(
        "personaplex",
        PluginOptions(
            model_dir=str(tiny_checkpoint), max_sessions=1, extra={"sampling": "reference"}
        ),
    )
    assert isinstance(loaded, PersonaPlexPlugin)
    _start(loaded)
    frames = speech_like_frames(seed=9, count=6)

    def run(**extra_body: object) -> list:
        config = _prepare(loaded, extra_body=extra_body)
        session = loaded.create_session(config)
        try:
            return [loaded.step([(session, f)])[0].tokens for f in frames]
        finally:
            loaded.close_session(session)

    try:
        assert run(seed=3) == run(seed=3)  # the server's preset: sampling, seeded per call
        assert run(seed=3) != run(seed=4)
        assert run(sampling="greedy") == run(sampling=False)
    finally:
        asyncio.run(loaded.close())
