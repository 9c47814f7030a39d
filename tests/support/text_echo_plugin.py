"""A test-only plugin: the echo plugin that also speaks text, with voices it cannot change.

Every `frames_per_word` frames it emits the next word of a fixed script as a transcript
piece, and ends a segment after each sentence, so a client sees
`response.output_audio_transcript.delta` and `.done` without a model. It offers two voices
and refuses voice changes mid-call (the PersonaPlex policy), while instructions may change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from agent.plugins.base import (
    Capabilities,
    PluginError,
    PluginSession,
    RuntimeConfig,
    SessionConfig,
    StepOutput,
)
from agent.plugins.echo import EchoPlugin, EchoSession

SCRIPT = ("Hello there. ", "This is the test agent speaking. ")
VOICES = ("Alpha.pt", "Bravo.pt")


class TextEchoSession(EchoSession):
    def restart(self) -> None:
        super().restart()
        self.frame_count = 0
        self.word_index = 0


class TextEchoPlugin(EchoPlugin):
    id = "text-echo"

    def __init__(self, frames_per_word: int = 3, max_sessions: int = 0) -> None:
        super().__init__(max_sessions=max_sessions)
        self.frames_per_word = frames_per_word
        self.words = [word + " " for sentence in SCRIPT for word in sentence.split()]
        self.sentence_ends = {
            i for i, word in enumerate(self.words) if word.rstrip().endswith(".")
        }
        self._capabilities = replace(
            self._capabilities, emits_text=True, voices=VOICES, default_voice=VOICES[0],
            voice_update=False, instructions_update=True,
        )

    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        voice = session_config.voice or VOICES[0]
        if voice not in VOICES:
            raise PluginError("unknown_voice", f"no voice named '{voice}'", param="session.voice")
        config = await super().prepare_runtime_config(session_config)
        return replace(config, voice=voice)

    def runtime_config_for_update(
        self, current: RuntimeConfig, update: SessionConfig
    ) -> RuntimeConfig:
        if update.voice is not None and update.voice != current.voice:
            raise PluginError("voice_update_unsupported",
                              "the test agent cannot change voice during a call",
                              param="session.voice")
        return super().runtime_config_for_update(current, update)

    def create_session(self, config: RuntimeConfig) -> TextEchoSession:
        return TextEchoSession(config, self.silence_frame())

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        outputs = super().step(batch)
        for (session, _), output in zip(batch, outputs, strict=False):
            assert isinstance(session, TextEchoSession)
            session.frame_count += 1
            if session.frame_count % self.frames_per_word == 0:
                index = session.word_index % len(self.words)
                output.text = self.words[index]
                output.segment_end = index in self.sentence_ends
                session.word_index += 1
        return outputs
