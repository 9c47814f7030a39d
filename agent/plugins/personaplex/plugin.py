"""The `personaplex` and `moshi` plugins: a released checkpoint directory served to many calls
at once, one batched model step per tick.

- `personaplex`: dep_q 16 layout; every call opens with a voice prompt (bundled `.pt`) and a
  persona (the client's `instructions`), prefilled once per (voice, persona) and copied into
  the call's slot.
- `moshi`: Kyutai's dep_q 8 layout; no voices and no persona, every call starts fresh.

Threading follows base.py: loading runs in a worker thread from `start`; prompt prefills run on
the prompt cache's own thread; sessions and steps run on the ticker's thread.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors import SafetensorError

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
from agent.plugins.moshi_defaults import DEFAULT_PERSONA, DEFAULT_VOICE
from agent.plugins.personaplex import checkpoint, lm_config, mimi_config, policy
from agent.plugins.personaplex.prompt import (
    PromptCache,
    PromptKey,
    PromptPlan,
    VoicePrompt,
    check_voice_prompt,
    detached_copy,
    persona_tokens,
)
from agent.plugins.personaplex.sampling import SamplingConfig
from agent.plugins.personaplex.stepper import BatchedStepper, FrameResult, SlotHandle
from agent.plugins.personaplex.voice_audio import (
    UploadedVoices,
    VoiceAudioError,
    encode_voice,
    read_voice_audio,
)

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
FRAME_SIZE = 1920
DEFAULT_CPU_SESSIONS = 4
DEFAULT_CUDA_SESSIONS = 64
DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
HIDDEN_TEXT_IDS = frozenset({0, 3})  # EPAD and PAD


def parse_device(name: str | None) -> torch.device:
    try:
        device = torch.device(name or "cpu")
    except (RuntimeError, ValueError) as exc:
        raise PluginError("invalid_device", f"unknown device '{name}': {exc}",
                          param="device") from exc
    if device.type not in ("cpu", "cuda"):
        raise PluginError("invalid_device", f"device '{name}' is not supported (cpu or cuda)",
                          param="device")
    return device


def parse_dtype(name: str | None, device: torch.device) -> torch.dtype:
    if name is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = DTYPES.get(name.lower())
    if dtype is None:
        raise PluginError("invalid_dtype",
                          f"dtype '{name}' is not one of float32, bfloat16, float16",
                          param="dtype")
    return dtype


def text_piece(tokenizer: Any, token: int | None) -> str:
    """What a text token shows the user: pads and control pieces hidden, '▁' as a space."""
    if token is None or token in HIDDEN_TEXT_IDS or not 0 <= token < tokenizer.get_piece_size():
        return ""
    if tokenizer.is_control(token) or tokenizer.is_unknown(token):
        return ""
    return tokenizer.id_to_piece(token).replace("\u2581", " ")


def to_sampling_config(options: policy.SamplingOptions) -> SamplingConfig:
    return SamplingConfig(
        use_sampling=options.use_sampling, temp=options.temperature, top_k=options.top_k,
        temp_text=options.temperature_text, top_k_text=options.top_k_text,
    )


@dataclass
class LoadedModel:
    files: checkpoint.CheckpointFiles
    info: lm_config.CheckpointInfo
    tokenizer: Any
    stepper: BatchedStepper
    prompts: PromptCache | None


# RuntimeConfig.options key holding the post-prompt snapshot a session opens from (server-side
# only: the same name is a private extra_body key, so a client cannot set it).
SNAPSHOT_OPTION = "prompt_snapshot"


def prompt_plan(files: checkpoint.CheckpointFiles, lm: Any, mimi: Any, tokenizer: Any,
                voice: str | None, persona: str | None, uploads: UploadedVoices) -> PromptPlan:
    """What to prefill for (voice, persona); runs on the prefill thread."""
    voice_prompt, voice_codes = None, None
    if voice is not None and policy.voice_kind(voice) == "recording":
        uploaded = uploads.get(voice)
        source = uploaded if uploaded is not None else files.voices[voice]
        assert isinstance(source, (Path, bytes))  # a file in the voices folder, or an upload
        audio = read_voice_audio(source, SAMPLE_RATE, name=voice)
        voice_codes = encode_voice(mimi, audio, lm.num_agent_codebooks)
    elif voice is not None:
        raw = files.load_voice(voice, lm.device)
        voice_prompt = VoicePrompt(embeddings=raw["embeddings"], cache=raw["cache"])
        check_voice_prompt(voice_prompt, lm, voice)
    tokens = persona_tokens(tokenizer, persona) if persona is not None else ()
    return PromptPlan(voice=voice_prompt, text_tokens=tokens, voice_codes=voice_codes)


def step_output(model: LoadedModel, result: FrameResult) -> StepOutput:
    return StepOutput(
        audio=result.audio,
        text=text_piece(model.tokenizer, result.text_token),
        tokens={"text": result.text_token, "audio": result.audio_codes, "user": result.user_codes},
    )


class PersonaPlexSession(PluginSession):
    def __init__(self, config: RuntimeConfig, handle: SlotHandle, snapshot: Any, seed: int) -> None:
        super().__init__(config)
        self.handle = handle
        self.snapshot = snapshot  # kept for restarts, whatever the prompt cache evicts
        self.seed = seed
        self.frames = 0


class PersonaPlexPlugin(Plugin):
    id: ClassVar[str] = "personaplex"
    private_keys: ClassVar[frozenset[str]] = policy.PRIVATE_EXTRA_BODY_KEYS
    dep_q: ClassVar[int] = 16
    uses_prompt: ClassVar[bool] = True
    model_flags: ClassVar[frozenset[str] | None] = frozenset({"--model-dir", "--device",
                                                               "--dtype", "--voice"})
    flags: ClassVar[tuple[PluginFlag, ...]] = (
        PluginFlag("--sampling", "token choice when a call does not set extra_body.sampling: "
                   "greedy (argmax), or reference = NVIDIA's server defaults (sampling, "
                   "temperature 0.8/0.7, top-k 250/25)", default="greedy",
                   choices=("greedy", "reference")),
        PluginFlag("--prompt-cache-size", "prompt snapshots (voice, persona) kept ready "
                   "(default 32 on CPU, 16 on CUDA)", type=int, metavar="N"),
    )

    def __init__(self, model_dir: str | None, device: str = "cpu", dtype: str | None = None,
                 max_sessions: int = 0, voice: str | None = None,
                 prompt_cache_size: int | None = None, sampling: str = "greedy") -> None:
        self.model_dir = model_dir
        policy.sampling_choice(sampling)  # a bad --sampling fails at start-up
        self.sampling = sampling
        self.device = parse_device(device)
        self.dtype = parse_dtype(dtype, self.device)
        default_sessions = (DEFAULT_CUDA_SESSIONS if self.device.type == "cuda"
                            else DEFAULT_CPU_SESSIONS)
        if max_sessions < 0:
            raise PluginError("invalid_max_sessions", "max_sessions must be >= 0",
                              param="max_sessions")
        self.max_sessions = max_sessions or default_sessions
        self.default_voice = voice or (DEFAULT_VOICE if self.uses_prompt else None)
        # A snapshot holds the prompt's filled KV entries (about 0.1 GB for the 7B model and a
        # ~200-frame prompt), so a GPU keeps fewer; live sessions keep their own alive anyway.
        self.prompt_cache_size = prompt_cache_size or (16 if self.device.type == "cuda" else 32)
        self.model: LoadedModel | None = None
        self.uploads = UploadedVoices()

    @classmethod
    def from_options(cls, options: PluginOptions) -> PersonaPlexPlugin:
        cache_size = options.extra.get("prompt_cache_size")
        return cls(options.model_dir, options.device, options.dtype, options.max_sessions,
                   options.voice, int(cache_size) if cache_size else None,
                   str(options.extra.get("sampling") or "greedy"))

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.model is not None:
            return
        self.model = await asyncio.to_thread(self._load)
        if self.model.prompts is not None:
            # The default prompt is what most calls use: have it ready before the first call.
            await self.model.prompts.get((self.default_voice, DEFAULT_PERSONA))

    async def close(self) -> None:
        if self.model is not None and self.model.prompts is not None:
            await asyncio.to_thread(self.model.prompts.close)
        self.model = None

    def _load(self) -> LoadedModel:
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise PluginError("device_unavailable",
                              "--device cuda was asked for but CUDA is not available",
                              param="device", status=500)
        files = checkpoint.inspect_checkpoint(self.model_dir, need_voices=self.uses_prompt)
        checkpoint.check_layout(files.config, self.dep_q, self.id)
        if self.uses_prompt and self.default_voice is not None:
            self.default_voice = policy.validate_voice(self.default_voice, files.voices,
                                                       self.default_voice)
        try:
            return self._load_weights(files)
        except torch.cuda.OutOfMemoryError as exc:
            raise PluginError(
                "gpu_out_of_memory",
                f"the GPU has not enough free memory for this model with max_sessions="
                f"{self.max_sessions}: {str(exc)[:300]} (lower --max-sessions or use a bigger GPU)",
                param="max_sessions", status=500,
            ) from exc
        except (mimi_config.MimiConfigError, ValueError, KeyError) as exc:
            raise checkpoint.unsupported_error(f"{files.model_dir}: {exc}") from exc
        except (OSError, SafetensorError, RuntimeError) as exc:  # unreadable or corrupt files
            raise checkpoint.model_dir_error(f"{files.model_dir}: {str(exc)[:500]}") from exc

    def _load_weights(self, files: checkpoint.CheckpointFiles) -> LoadedModel:
        import sentencepiece

        info = lm_config.load_checkpoint_info(files.model_dir)
        tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(files.tokenizer))
        text_card = int(info.lm_kwargs.get("text_card", 32000))
        if tokenizer.get_piece_size() > text_card:
            raise ValueError(
                f"the tokenizer has {tokenizer.get_piece_size()} pieces but text_card is "
                f"{text_card}"
            )
        lm = lm_config.load_lm(info, self.device, self.dtype)
        mimi_codebooks = max(lm.num_agent_codebooks, lm.num_user_codebooks)
        # The codec stays float32: it is small, and bf16 would cost audio quality for little gain.
        mimi = mimi_config.load_mimi(files.mimi_weights, info.mimi_config, self.device,
                                     torch.float32, mimi_codebooks)
        if mimi.frame_size != FRAME_SIZE or mimi.sample_rate != SAMPLE_RATE:
            raise ValueError(f"Mimi frames are {mimi.frame_size} @ {mimi.sample_rate} Hz; "
                             f"the plugin serves {FRAME_SIZE} @ {SAMPLE_RATE} Hz")
        prompts = None
        if self.uses_prompt:
            # Voice recordings are encoded on the prefill thread, on a copy of Mimi with its
            # own streaming state (the live calls stream through the original).
            voice_mimi = detached_copy(mimi)
            prompts = PromptCache(
                lm, lambda voice, persona: prompt_plan(files, lm, voice_mimi, tokenizer, voice,
                                                       persona, self.uploads),
                capacity=self.prompt_cache_size)
        stepper = BatchedStepper(lm, mimi, self.max_sessions)
        log.info("%s: loaded %s on %s (%s), %d sessions", self.id, files.model_dir, self.device,
                 self.dtype, self.max_sessions)
        return LoadedModel(files, info, tokenizer, stepper, prompts)

    def _loaded(self) -> LoadedModel:
        if self.model is None:
            raise PluginError("not_ready", f"plugin '{self.id}' has not loaded its model yet",
                              status=503)
        return self.model

    # ------------------------------------------------------------------ policy

    def capabilities(self) -> Capabilities:
        voices = self.model.files.voice_names if self.model is not None and self.uses_prompt else ()
        return Capabilities(
            sample_rate=SAMPLE_RATE, frame_size=FRAME_SIZE, max_sessions=self.max_sessions,
            emits_text=True, voices=voices, default_voice=self.default_voice,
            voice_kinds=tuple((name, policy.voice_kind(name)) for name in voices),
            voice_update=False, instructions_update=False, voice_upload=self.uses_prompt,
        )

    def _voice_and_persona(self, model: LoadedModel,
                           config: SessionConfig) -> tuple[str | None, str | None]:
        assert self.default_voice is not None
        if config.voice_audio is not None:
            voice = policy.uploaded_voice_name(config.voice_audio)
        else:
            voice = policy.validate_voice(config.voice, model.files.voices, self.default_voice)
        return voice, policy.persona_instructions(config.instructions)

    async def prepare_runtime_config(self, session_config: SessionConfig) -> RuntimeConfig:
        model = self._loaded()
        check_extra_body(self, session_config.extra_body, policy.CLIENT_EXTRA_BODY_KEYS)
        voice, persona = self._voice_and_persona(model, session_config)
        kwargs = model.info.lm_kwargs
        sampling = policy.sampling_options(session_config.extra_body, int(kwargs["card"]),
                                           int(kwargs["text_card"]), self.sampling)
        options: dict[str, Any] = {"sampling": sampling}
        if model.prompts is not None:
            # A prompting plugin always has a voice: the caller's, else the default one.
            assert voice is not None
            options[SNAPSHOT_OPTION] = await self._prompt_snapshot(model.prompts, voice, persona,
                                                                   session_config.voice_audio)
        return RuntimeConfig(voice=voice, instructions=persona, options=options)

    async def _prompt_snapshot(self, prompts: PromptCache, voice: str, persona: str | None,
                               upload: bytes | None) -> Any:
        if upload is None:
            try:
                return await prompts.get((voice, persona))
            except ValueError as exc:  # a voice file that does not fit the model
                raise checkpoint.model_dir_error(str(exc)) from exc
        with self.uploads.holding(voice, upload):
            try:
                return await prompts.get((voice, persona))
            except VoiceAudioError as exc:  # the caller's recording, not the server's files
                raise PluginError("invalid_voice_audio", str(exc), param="voice_audio") from None

    def runtime_config_for_update(self, current: RuntimeConfig,
                                  update: SessionConfig) -> RuntimeConfig:
        if update.voice is not None and update.voice != current.voice:
            raise policy.voice_update_unsupported(self.id)
        if (update.instructions is not None
                and update.instructions.strip() != (current.instructions or "")):
            raise policy.persona_update_unsupported(self.id)
        if update.extra_body:
            check_extra_body(self, update.extra_body, frozenset())
        return current

    # ------------------------------------------------------------------ sessions (ticker thread)

    def _snapshot(self, model: LoadedModel, config: RuntimeConfig) -> Any:
        if model.prompts is None:
            return None
        snapshot = config.options.get(SNAPSHOT_OPTION)
        if snapshot is not None:
            return snapshot
        # A config not made by prepare_runtime_config: prefill now (blocks this thread once).
        key: PromptKey = (config.voice, config.instructions)
        return model.prompts.ready(key) or model.prompts.get_blocking(key)

    def create_session(self, config: RuntimeConfig) -> PersonaPlexSession:
        model = self._loaded()
        if model.stepper.free_slots == 0:
            raise PluginError("max_sessions_reached",
                              f"all {self.max_sessions} sessions of plugin '{self.id}' are in use",
                              status=503)
        options: policy.SamplingOptions = config.options.get("sampling", policy.SamplingOptions())
        seed = options.seed if options.seed is not None else secrets.randbits(31)
        snapshot = self._snapshot(model, config)
        handle = model.stepper.acquire(snapshot, to_sampling_config(options), seed)
        return PersonaPlexSession(config, handle, snapshot, seed)

    def restart_session(self, session: PluginSession) -> None:
        assert isinstance(session, PersonaPlexSession)
        model = self._loaded()
        model.stepper.load(session.handle, session.snapshot, session.seed)
        session.frames = 0

    def close_session(self, session: PluginSession) -> None:
        assert isinstance(session, PersonaPlexSession)
        if self.model is not None:
            self.model.stepper.release(session.handle)

    def step(self, batch: Sequence[tuple[PluginSession, np.ndarray]]) -> list[StepOutput]:
        model = self._loaded()
        if not batch:
            return []
        sessions = [session for session, _ in batch]
        frames = np.stack([np.asarray(frame, dtype=np.float32).reshape(-1) for _, frame in batch])
        handles = []
        for session in sessions:
            assert isinstance(session, PersonaPlexSession)
            handles.append(session.handle)
        results = model.stepper.step(handles, frames)
        outputs = []
        for session, result in zip(sessions, results, strict=False):
            assert isinstance(session, PersonaPlexSession)
            session.frames += 1
            outputs.append(step_output(model, result))
        return outputs


class MoshiPlugin(PersonaPlexPlugin):
    """Kyutai Moshi: the dep_q 8 layout, no voice prompt and no persona."""

    id: ClassVar[str] = "moshi"
    dep_q: ClassVar[int] = 8
    uses_prompt: ClassVar[bool] = False

    def _voice_and_persona(self, model: LoadedModel,
                           config: SessionConfig) -> tuple[str | None, str | None]:
        if config.voice:
            raise PluginError("invalid_voice", "plugin 'moshi' has no selectable voices",
                              param="session.voice")
        if config.instructions and config.instructions.strip():
            raise PluginError("instructions_unsupported",
                              "plugin 'moshi' takes no instructions (it has no persona prompt)",
                              param="session.instructions")
        return None, None

    def runtime_config_for_update(self, current: RuntimeConfig,
                                  update: SessionConfig) -> RuntimeConfig:
        if update.voice:
            raise policy.voice_update_unsupported(self.id)
        if update.instructions and update.instructions.strip():
            raise policy.persona_update_unsupported(self.id)
        if update.extra_body:
            check_extra_body(self, update.extra_body, frozenset())
        return current
