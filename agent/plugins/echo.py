"""The echo plugin: each input frame comes back unchanged, optionally N frames later.

It runs the same 24 kHz, 80 ms framing as the speech models, so the whole media path is
exercised with no weights."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from agent.plugins.base import (
    Capabilities,
    Plugin,
    PluginError,
    PluginFlag,
    PluginOptions,
    PluginSession,
    RuntimeConfig,
    SessionConfig,
    StepOutput,
    check_extra_body,
)

ECHO_OPTIONS = frozenset({"delay_frames"})
MAX_DELAY_FRAMES = 50


def delay_frames_option(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PluginError(
            "invalid_option", "extra_body.delay_frames must be an integer",
            param="extra_body.delay_frames",
        )
    if not 0 <= value <= MAX_DELAY_FRAMES:
        raise PluginError(
            "invalid_option",
            f"extra_body.delay_frames must be between 0 and {MAX_DELAY_FRAMES}",
            param="extra_body.delay_frames",
        )
    return value


class EchoSession(PluginSession):
    def __init__(self, config: RuntimeConfig, silence: np.ndarray) -> None:
        super().__init__(config)
        self.silence = silence
        self.delay_line: deque[np.ndarray] = deque()
        self.restart()

    def restart(self) -> None:
        delay = int(self.config.options.get("delay_frames", 0))
        self.delay_line = deque([self.silence] * delay)


class EchoPlugin(Plugin):
    id = "echo"
    runs_per_worker = True
    model_flags = frozenset[str]()  # no model, no voices: --model-dir and the like are refused
    flags = (
        PluginFlag("--echo-max-sessions", "calls one process's echo plugin holds at most, as "
                   "a model's batch limit would (each worker's own; --max-sessions stays the "
                   "whole server's; default: --max-sessions)", type=int, metavar="N"),
    )

    def __init__(self, sample_rate: int = 24000, frame_size: int = 1920,
                 max_sessions: int = 0) -> None:
        self._capabilities = Capabilities(
            sample_rate=sample_rate, frame_size=frame_size, max_sessions=max_sessions,
            voice_update=True, instructions_update=True,
        )

    @classmethod
    def from_options(cls, options: PluginOptions) -> EchoPlugin:
        own = options.extra.get("echo_max_sessions")
        return cls(max_sessions=options.max_sessions if own is None else max(0, own))

    def capabilities(self) -> Capabilities:
        return self._capabilities

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        check_extra_body(self, session_config.extra_body, ECHO_OPTIONS)
        options = {}
        if "delay_frames" in session_config.extra_body:
            options["delay_frames"] = delay_frames_option(
                session_config.extra_body["delay_frames"]
            )
        # Echo has no voices; it keeps what the client said so session.created reflects it.
        return RuntimeConfig(
            voice=session_config.voice,
            instructions=session_config.instructions,
            options=options,
        )

    def runtime_config_for_update(
        self, current: RuntimeConfig, update: SessionConfig
    ) -> RuntimeConfig:
        # Voice and instructions mean nothing to an echo, so any value is accepted as-is.
        check_extra_body(self, update.extra_body, frozenset())
        return RuntimeConfig(
            voice=update.voice if update.voice is not None else current.voice,
            instructions=(
                update.instructions if update.instructions is not None
                else current.instructions
            ),
            options=current.options,
        )

    def create_session(self, config: RuntimeConfig) -> EchoSession:
        return EchoSession(config, self.silence_frame())

    def restart_session(self, session: PluginSession) -> None:
        assert isinstance(session, EchoSession)
        session.restart()

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        outputs = []
        for session, frame in batch:
            assert isinstance(session, EchoSession)
            session.delay_line.append(frame)
            outputs.append(StepOutput(audio=session.delay_line.popleft()))
        return outputs
