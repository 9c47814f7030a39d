"""The plugin contract: what a speech model provides so the ticker can drive it.

A plugin serves many calls at once. Each call gets a *session*; once per frame period the
ticker hands the plugin one input frame per live session and gets one output frame back per
session, in a single batched `step` call, so a GPU model serves every call with one forward
pass per tick.

Threading: `capabilities`, `prepare_runtime_config` and `runtime_config_for_update` run on the
event loop (the async one may push file loads to threads itself). `create_session`,
`restart_session`, `close_session` and `step` run on the ticker's single worker thread, never
concurrently with each other, so a plugin can keep per-slot model state without locks.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from agent.end_reason import CodedEnding, EndReason, coded
from agent.errors import AgentError


class PluginError(AgentError):
    """A plugin's refusal: HTTP 4xx at offer time, an `error` event later."""


SESSION_CONFIG_KEYS = frozenset({"voice", "instructions", "extra_body"})


@dataclass(frozen=True)
class SessionConfig:
    """What a client asked for (all optional); the plugin decides what it means."""

    voice: str | None = None
    instructions: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # A voice recording uploaded with the offer (its bytes, as sent); only plugins whose
    # capabilities say `voice_upload` take it.
    voice_audio: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, obj: Any, *, param: str = "session") -> SessionConfig:
        """Validate the JSON shape only; plugin policy comes later."""
        if obj is None:
            return cls()
        if not isinstance(obj, dict):
            raise PluginError("invalid_session", f"'{param}' must be an object", param=param)
        voice = _optional_str(obj, "voice", param)
        instructions = _optional_str(obj, "instructions", param)
        extra_body = obj.get("extra_body") or {}
        if not isinstance(extra_body, dict):
            raise PluginError(
                "invalid_session",
                f"'{param}.extra_body' must be an object",
                param=f"{param}.extra_body",
            )
        return cls(voice=voice, instructions=instructions, extra_body=dict(extra_body))

    def merged(self, update: SessionConfig) -> SessionConfig:
        """Fields set in `update` win; extra_body keys merge."""
        return SessionConfig(
            voice=update.voice if update.voice is not None else self.voice,
            instructions=(
                update.instructions if update.instructions is not None else self.instructions
            ),
            extra_body={**self.extra_body, **update.extra_body},
            voice_audio=update.voice_audio if update.voice_audio is not None else self.voice_audio,
        )


def _optional_str(obj: Mapping[str, Any], key: str, param: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise PluginError(
            "invalid_session", f"'{param}.{key}' must be a string", param=f"{param}.{key}"
        )
    return value


@dataclass(frozen=True)
class RuntimeConfig:
    """Validated settings one session runs with. `options` holds plugin-specific values."""

    voice: str | None = None
    instructions: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """The client-visible part (for `session.created` / `session.updated`)."""
        return {"voice": self.voice, "instructions": self.instructions}


@dataclass(frozen=True)
class Capabilities:
    sample_rate: int
    frame_size: int
    channels: int = 1
    max_sessions: int = 0  # 0 = no plugin-side limit
    emits_text: bool = False
    voices: tuple[str, ...] = ()
    # What each voice is, where a plugin has several kinds (e.g. "embeddings", "recording").
    voice_kinds: tuple[tuple[str, str], ...] = ()
    default_voice: str | None = None
    voice_update: bool = False
    instructions_update: bool = False
    voice_upload: bool = False  # takes SessionConfig.voice_audio

    @property
    def frame_seconds(self) -> float:
        return self.frame_size / self.sample_rate

    def to_dict(self) -> dict[str, Any]:
        return {
            "sample_rate": self.sample_rate,
            "frame_size": self.frame_size,
            "frame_ms": round(self.frame_seconds * 1000, 3),
            "channels": self.channels,
            "max_sessions": self.max_sessions,
            "emits_text": self.emits_text,
            "voices": list(self.voices),
            "voice_kinds": dict(self.voice_kinds),
            "default_voice": self.default_voice,
            "voice_update": self.voice_update,
            "instructions_update": self.instructions_update,
            "voice_upload": self.voice_upload,
        }


@dataclass
class StepOutput:
    """One frame of agent output for one session.

    `audio` is float32 in [-1, 1], shape (frame_size,) for mono or (frame_size, channels).
    `text` is the text piece the model emitted this frame, "" when none (pads are hidden).
    `segment_end` says the agent's current spoken text segment ended at this frame.
    `error` is a per-session failure to report to the caller as an `error` event (a plugin
    that serves each call over its own connection, like a remote engine, fails per call);
    `end_call` says this session cannot go on and the call should end after this frame.
    """

    audio: np.ndarray
    text: str = ""
    segment_end: bool = False
    tokens: Mapping[str, Any] | None = None
    error: PluginError | None = None
    end_call: bool = False

    @property
    def end_reason(self) -> EndReason | CodedEnding | None:
        """Why the call should end after this frame (the error's code), or None to go on."""
        if not self.end_call:
            return None
        return coded(self.error.code) if self.error is not None else EndReason.PLUGIN_ENDED

    def mono_audio(self) -> np.ndarray:
        """The audio as one channel (channels averaged) for playout."""
        return self.audio if self.audio.ndim == 1 else self.audio.mean(axis=1)


class PluginSession:
    """Per-call state owned by a plugin. Subclass it to hold model slots and the like."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config

    def stats(self) -> dict[str, Any]:
        """Per-session numbers for `/metrics/calls` (read on the event loop); none by default."""
        return {}


@dataclass(frozen=True)
class PluginFlag:
    """A command-line flag a plugin declares for itself (`Plugin.flags`). Its value reaches
    `from_options` in `PluginOptions.extra[flag.dest]`, so a third-party plugin gets flags
    without editing signaling/."""

    name: str  # "--sampling"
    help: str
    default: Any = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


# The command-line flags behind PluginOptions' shared fields (the server's "model plugins"
# group), which a plugin names in `Plugin.model_flags`.
MODEL_FLAGS = ("--model-dir", "--device", "--dtype", "--voice", "--upstream", "--model")


@dataclass(frozen=True)
class PluginOptions:
    """Server-wide settings a plugin may use (from the CLI); each plugin reads what it needs."""

    model_dir: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    max_sessions: int = 0
    voice: str | None = None
    upstreams: tuple[str, ...] = ()
    model: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class Plugin(abc.ABC):
    """A speech model the ticker can drive. See the module docstring for threading rules."""

    id: ClassVar[str]
    # Keys in extra_body that only the server may set; a client sending one is refused.
    private_keys: ClassVar[frozenset[str]] = frozenset()
    # This plugin's own command-line flags (shown by `--plugin ID --help`).
    flags: ClassVar[tuple[PluginFlag, ...]] = ()
    # Which of the server's shared model flags (MODEL_FLAGS) it reads from PluginOptions; the
    # others given to it are refused at start-up. None: it may read any of them.
    model_flags: ClassVar[frozenset[str] | None] = None
    # Whether each of several worker processes (`--workers`) may load its own instance.
    # A model held in this process (a GPU's batched step) says no: all its calls stay in
    # one process so one step serves them all.
    runs_per_worker: ClassVar[bool] = False

    @classmethod
    def from_options(cls, options: PluginOptions) -> Plugin:
        return cls()

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @property
    def sample_rate(self) -> int:
        return self.capabilities().sample_rate

    @property
    def frame_size(self) -> int:
        return self.capabilities().frame_size

    @property
    def channels(self) -> int:
        return self.capabilities().channels

    async def start(self) -> None:
        """Load weights and the like; awaited once before the first call.

        An optional hook: nothing to load by default."""
        return None

    async def close(self) -> None:
        """Release what `start` acquired. An optional hook: nothing by default."""
        return None

    def health(self) -> dict[str, Any]:
        """Plugin-wide numbers for `/health` (event loop), e.g. a remote engine pool's state."""
        return {}

    @abc.abstractmethod
    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        """Validate a client's session config; raise PluginError with a code when refused."""

    async def validate_session_config(self, session_config: SessionConfig) -> None:
        """Refuse a config before any call exists (e.g. when a client secret is minted).

        The default prepares a runtime config and drops it; a plugin whose preparation
        reserves something (a remote engine session) overrides this to validate only."""
        await self.prepare_runtime_config(session_config)

    def discard_runtime_config(self, config: RuntimeConfig) -> None:
        """A prepared config no session will use: the call failed before `create_session`.

        Release whatever preparing it reserved (event loop). Nothing to do by default."""
        return None

    def runtime_config_for_update(
        self, current: RuntimeConfig, update: SessionConfig
    ) -> RuntimeConfig:
        """A mid-call `session.update`. The default refuses every change it cannot take."""
        if update.voice is not None and update.voice != current.voice:
            raise PluginError(
                "voice_update_unsupported",
                f"plugin '{self.id}' cannot change the voice during a call",
                param="session.voice",
            )
        if update.instructions is not None and update.instructions != current.instructions:
            raise PluginError(
                "persona_update_unsupported",
                f"plugin '{self.id}' cannot change the instructions during a call",
                param="session.instructions",
            )
        if update.extra_body:
            check_extra_body(self, update.extra_body, frozenset())
        return current

    @abc.abstractmethod
    def create_session(self, config: RuntimeConfig) -> PluginSession:
        """Make a session's state (ticker thread). Raise PluginError when full."""

    def restart_session(self, session: PluginSession) -> None:
        """Start a new epoch: back to the state right after the prompt (ticker thread).

        An optional hook: a plugin with no per-epoch state does nothing."""
        return None

    def close_session(self, session: PluginSession) -> None:
        """Free the session's resources (ticker thread). An optional hook: nothing by default."""
        return None

    def handle_dtmf(self, session: PluginSession, digit: str) -> None:
        """A telephone keypad digit ("0"-"9", "*", "#", "A"-"D") from the caller (ticker
        thread). Telephony legs call it; a plugin that has no use for digits ignores them."""
        return None

    @abc.abstractmethod
    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        """Advance every session in `batch` by one frame (ticker thread).

        Each input frame is float32, shape (frame_size,) or (frame_size, channels).
        Returns one StepOutput per batch entry, in order.
        """

    def silence_frame(self) -> np.ndarray:
        """What the ticker feeds a session whose caller sent nothing this period."""
        shape = (
            (self.frame_size,) if self.channels == 1 else (self.frame_size, self.channels)
        )
        return np.zeros(shape, dtype=np.float32)


def check_extra_body(plugin: Plugin, extra_body: Mapping[str, Any],
                     allowed: frozenset[str]) -> None:
    """Refuse the plugin's server-private keys first, then keys it does not know."""
    for key in extra_body:
        if key in plugin.private_keys:
            raise PluginError(
                "private_option",
                f"extra_body.{key} is set by the server and cannot be set by a client",
                param=f"extra_body.{key}",
            )
    for key in extra_body:
        if key not in allowed:
            raise PluginError(
                "unknown_option",
                f"extra_body.{key} is not an option of plugin '{plugin.id}'",
                param=f"extra_body.{key}",
            )
